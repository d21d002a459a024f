"""torch's ``multiprocessing.subprocess_handler``: one worker process under ``Popen``."""

from elastic.multiprocessing.subprocess_handler.handlers import get_subprocess_handler
from elastic.multiprocessing.subprocess_handler.subprocess_handler import SubprocessHandler

__all__ = ["SubprocessHandler", "get_subprocess_handler"]
