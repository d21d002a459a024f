"""Every event kind the agent emits, and the reasons it gives, in one place.

The string values are the public event-log schema (DESIGN §4): they never change.  The
agent emits them, and the simulator's report, losses, checkers, plot, event-log reader
and calibration read them; each names the constant, never the literal, so a kind cannot
be misspelt on one side only.

Kinds use torch's names where torch has one (``torchelastic.worker.status.<STATE>``,
``RENDEZVOUS``, ``ASSIGN_WORKER_RANKS``); ``agent.*`` are ours.
"""

from __future__ import annotations

from typing import Final

__all__ = [
    "AGENT_EXIT_BARRIER",
    "AGENT_EXIT_BARRIER_ERROR",
    "AGENT_FINISH",
    "AGENT_GPU_CHECK",
    "AGENT_GRACEFUL_EXIT",
    "AGENT_GROUP_STARTED",
    "AGENT_GROUP_STOPPED",
    "AGENT_HANG",
    "AGENT_HEALTH_SERVER",
    "AGENT_MEMBERSHIP_CHANGE",
    "AGENT_REFUSED_START",
    "AGENT_RENDEZVOUS_CLOSED",
    "AGENT_RENDEZVOUS_ERROR",
    "AGENT_RESTART",
    "AGENT_START",
    "AGENT_UNHEALTHY",
    "AGENT_WATCHDOG",
    "ASSIGN_WORKER_RANKS",
    "MEMBERSHIP_CLOSED",
    "MEMBERSHIP_CLOSED_AFTER_SUCCESS",
    "RANK_EXCHANGE_TIMEOUT",
    "RENDEZVOUS",
    "RESTART_FAILURE",
    "RESTART_MEMBERSHIP",
    "RESTART_UNHEALTHY",
    "STOP_RENDEZVOUS_CLOSED",
    "STOP_RESTARTS_EXHAUSTED",
    "STOP_SHUTDOWN",
    "WORKER_FAILED",
    "WORKER_START",
    "WORKER_STATUS",
    "WORKER_SUCCEEDED",
    "WORKER_TERMINATED",
]

# -- torch's kinds ----------------------------------------------------------------------
#: prefix of the per-worker status kinds (``torchelastic.worker.status.<STATE>``)
WORKER_STATUS: Final = "torchelastic.worker.status."
WORKER_START: Final = "torchelastic.worker.status.START"
WORKER_SUCCEEDED: Final = "torchelastic.worker.status.SUCCEEDED"
WORKER_FAILED: Final = "torchelastic.worker.status.FAILED"
WORKER_TERMINATED: Final = "torchelastic.worker.status.TERMINATED"
#: a rendezvous round completed for this agent (fields: round, group_rank, …)
RENDEZVOUS: Final = "RENDEZVOUS"
#: the agent's ranks were assigned (fields: world_size, base_global_rank, …)
ASSIGN_WORKER_RANKS: Final = "ASSIGN_WORKER_RANKS"

# -- the agent's own lifecycle ------------------------------------------------------------
AGENT_START: Final = "agent.start"
AGENT_FINISH: Final = "agent.finish"
AGENT_GRACEFUL_EXIT: Final = "agent.graceful_exit"
AGENT_REFUSED_START: Final = "agent.refused_start"
AGENT_RENDEZVOUS_CLOSED: Final = "agent.rendezvous_closed"
AGENT_RENDEZVOUS_ERROR: Final = "agent.rendezvous_error"
AGENT_GROUP_STARTED: Final = "agent.group_started"
AGENT_GROUP_STOPPED: Final = "agent.group_stopped"
AGENT_RESTART: Final = "agent.restart"
AGENT_MEMBERSHIP_CHANGE: Final = "agent.membership_change"
AGENT_UNHEALTHY: Final = "agent.unhealthy"
AGENT_EXIT_BARRIER: Final = "agent.exit_barrier"
AGENT_EXIT_BARRIER_ERROR: Final = "agent.exit_barrier_error"
# real mode's own
AGENT_HANG: Final = "agent.hang"
AGENT_HEALTH_SERVER: Final = "agent.health_server"
AGENT_GPU_CHECK: Final = "agent.gpu_check"
AGENT_WATCHDOG: Final = "agent.watchdog"

# -- reasons ----------------------------------------------------------------------------
#: ``agent.restart``'s ``reason`` (and its ``agent.group_stopped``'s): what ended the group
RESTART_FAILURE: Final = "failure"
RESTART_UNHEALTHY: Final = "unhealthy"
RESTART_MEMBERSHIP: Final = "membership"
#: ``agent.group_stopped``'s ``reason`` when the agent finishes
STOP_RESTARTS_EXHAUSTED: Final = "restarts_exhausted"
STOP_RENDEZVOUS_CLOSED: Final = "rendezvous_closed"
STOP_SHUTDOWN: Final = "shutdown"
#: a membership watch's reason when the rendezvous is closed for good
MEMBERSHIP_CLOSED: Final = "closed"
#: the agent's reason when the rendezvous closed while its workers run and a peer of the
#: round has reached the exit barrier (its workers all succeeded): this node's workers
#: are left to finish, as torch leaves them
MEMBERSHIP_CLOSED_AFTER_SUCCESS: Final = "closed_after_success"
#: ``agent.membership_change``'s ``reason`` when the round's rank exchange timed out
RANK_EXCHANGE_TIMEOUT: Final = "rank_exchange_timeout"
