"""Starting, watching and logging worker processes (torch's ``elastic.multiprocessing``).

The process launcher itself is the real workers port,
:class:`elastic.real.workers.ProcessWorkers`; this package holds what torch users touch:
the log layout (:mod:`.api`), the console tee (:mod:`.tail`) and error files (:mod:`.errors`).
"""

from elastic.multiprocessing.api import DefaultLogsSpecs, LogsDest, LogsSpecs, Std, to_map

__all__ = ["DefaultLogsSpecs", "LogsDest", "LogsSpecs", "Std", "to_map"]
