"""Expiration timers: a worker says "kill me if I am still here in N seconds".

torch's API and names (``torch.distributed.elastic.timer``)::

    from elastic import timer
    timer.configure(timer.FileTimerClient(os.environ["TORCHELASTIC_TIMER_FILE"]))
    with timer.expires(after=60):
        step()

Layout:

* :mod:`~elastic.timer.api` — ``TimerRequest``, ``TimerClient``, ``TimerServer``,
  ``RequestQueue``, ``configure``, ``expires``;
* :mod:`~elastic.timer.table` — the pure timer table (``now`` comes in as an argument);
* :mod:`~elastic.timer.driver` — the server core on the Clock port, the same in the
  simulator and for real: wakes at the next deadline or request, never polls;
* :mod:`~elastic.timer.local_timer` / :mod:`~elastic.timer.file_based_local_timer` —
  torch's two real client/server pairs, feeding that core;
* :mod:`~elastic.timer.guard` — which pids and signals a server's reap may use.

Safer than torch (deliberately):

1. After reaping an expired worker, torch's ``FileTimerServer`` sends the same signal
   to its *own* process (the agent dies without cleanup).  Here the server reaps the
   worker only and reports it (``log_event("kill worker process", ...)`` and
   ``on_reap``); the agent applies its restart policy.
2. torch signals whatever pid a request names with whatever signal it carries.  Here
   the requests are accepted and listed as in torch (``get_expired_timers`` reports
   every expired timer, fake pids included, and an overridden or mocked
   ``_reap_worker`` sees them all), but the default ``_reap_worker`` signals only the
   agent's workers (``set_worker_pids``, updated each (re)start, plus their
   descendants; never a pid ≤ 0 or the server itself) and only allowed signals
   (default ``{SIGKILL, SIGTERM}``); anything else is logged, not signalled, and its
   timers are dropped.
3. The FIFO is created owner-only (0o600); a line over ``PIPE_BUF`` bytes, not JSON,
   of an unknown ``version`` or with mistyped fields is refused.  Queue messages of the
   local pair are plain tuples, validated field by field.
4. The server wakes at the next deadline or request, not every ``max_interval``.
"""

from __future__ import annotations

from elastic.timer.api import (
    RequestQueue,
    TimerClient,
    TimerError,
    TimerRequest,
    TimerServer,
    configure,
    expires,
)
from elastic.timer.file_based_local_timer import FileTimerClient, FileTimerRequest, FileTimerServer
from elastic.timer.guard import Reaped
from elastic.timer.local_timer import (
    LocalTimerClient,
    LocalTimerServer,
    MultiprocessingRequestQueue,
)

__all__ = [
    "FileTimerClient",
    "FileTimerRequest",
    "FileTimerServer",
    "LocalTimerClient",
    "LocalTimerServer",
    "MultiprocessingRequestQueue",
    "Reaped",
    "RequestQueue",
    "TimerClient",
    "TimerError",
    "TimerRequest",
    "TimerServer",
    "configure",
    "expires",
]
