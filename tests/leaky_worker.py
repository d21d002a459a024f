"""A worker that starts what leaks: a helper, a double-forked daemon, an ``env={}`` one.

``leaky_worker.py <dir> <crash|wait|ok> [<seconds>]``: the three sleep ``<seconds>``
(default 300; a unique value lets a test find them by command line).  Writes
``<dir>/<local rank>_<attempt>`` with the three pids (atomically), then exits 1
(crash), sleeps (wait) or exits 0 (ok); ``<n>:<then>`` crashes in attempts below ``n``
and does ``<then>`` from attempt ``n`` on.  Used by
the leak regression tests and the soak test (tests/test_leaks.py, tests/test_soak.py,
bench/bench_soak.py).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time


def daemon(env: dict[str, str] | None, seconds: str) -> int:
    """A double-forked ``sleep`` in its own session (its parent, sh, exits at once)."""
    out = subprocess.run(
        ["/bin/sh", "-c", f"/bin/sleep {seconds} >/dev/null 2>&1 </dev/null & echo $!"],
        env=env,
        start_new_session=True,
        capture_output=True,
        text=True,
        check=True,
    )
    return int(out.stdout)


def main() -> None:
    where, mode = sys.argv[1], sys.argv[2]
    seconds = sys.argv[3] if len(sys.argv) > 3 else "300"
    rank = os.environ.get("LOCAL_RANK", "0")
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    helper = subprocess.Popen(["/bin/sleep", seconds])
    # LEAKY_MARKED_ONLY=1: no env={} daemon (a test of the marked tree alone)
    scrubbed = 0 if os.environ.get("LEAKY_MARKED_ONLY") == "1" else daemon({}, seconds)
    pids = [helper.pid, daemon(None, seconds), scrubbed]
    if ":" in mode:
        n, then = mode.split(":", 1)
        mode = "crash" if int(attempt) < int(n) else then
    path = os.path.join(where, f"{rank}_{attempt}")
    with open(path + ".tmp", "w") as f:
        f.write(" ".join(map(str, pids)))
    os.replace(path + ".tmp", path)
    if mode == "crash":
        sys.exit(1)
    if mode == "wait":
        time.sleep(300)


if __name__ == "__main__":
    main()
