"""Writing a worker's ``error.json`` and copying a child's into the agent's own.

The file format is torch's, so files written by torch's ``@record`` and by ours are read
by either side::

    {"message": {"message": "<Type>: <str(e)>",
                 "extraInfo": {"py_callstack": "<traceback>", "timestamp": "<int seconds>"}}}

Guarantees beyond torch's:

* files are written atomically (temporary file in the same directory, then rename), so the
  agent never reads half a file from a worker killed while writing;
* a file that cannot be written is reported with a warning, never with an exception that
  would hide the error being recorded;
* reading a child's file goes through :func:`read_error_file`, which never raises: it caps
  the size read and checks the shape, and says why a file was refused.

This module runs in worker processes (``@record``) and reads the wall clock there, since
the timestamp in the file is the worker's own observation of when it failed.
"""

from __future__ import annotations

import contextlib
import faulthandler
import json
import logging
import os
import time
import traceback
import warnings
from dataclasses import dataclass
from typing import Any

__all__ = ["MAX_ERROR_FILE_BYTES", "ErrorFileRead", "ErrorHandler", "read_error_file"]

logger = logging.getLogger(__name__)

#: Largest error file read, in bytes.  A Python traceback is a few kB; a file larger
#: than this was not written by an error handler, and reading it could exhaust memory.
MAX_ERROR_FILE_BYTES = 1 << 20


@dataclass(frozen=True, slots=True)
class ErrorFileRead:
    """The outcome of reading an error file: ``data`` (a JSON object) or ``problem``.

    Exactly one of the two is set.  ``problem`` is a short phrase for the report, such
    as ``"not valid JSON (Expecting value: line 1 column 1 (char 0))"``.
    """

    data: dict[str, Any] | None
    problem: str | None


def read_error_file(path: str, limit: int = MAX_ERROR_FILE_BYTES) -> ErrorFileRead:
    """Read and check an error file; never raises.

    Accepts a JSON object whose ``"message"`` is a string or an object; anything else
    (missing, not a regular file, larger than ``limit`` bytes, not UTF-8, not JSON, nested
    too deeply, wrong shape) comes back as a ``problem``.
    """
    try:
        # isfile() is False for FIFOs and devices: opening a FIFO would block the agent.
        if not os.path.isfile(path):
            return ErrorFileRead(None, "no such file")
        with open(path, "rb") as fp:
            raw = fp.read(limit + 1)
    except OSError as e:
        return ErrorFileRead(None, f"unreadable ({type(e).__name__}: {e.strerror or e})")
    if len(raw) > limit:
        return ErrorFileRead(None, f"larger than {limit} bytes; not read")
    try:
        data = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        return ErrorFileRead(None, "not UTF-8 text")
    except json.JSONDecodeError as e:
        return ErrorFileRead(None, f"not valid JSON ({e})")
    except RecursionError:
        return ErrorFileRead(None, "JSON nested too deeply")
    if not isinstance(data, dict):
        return ErrorFileRead(None, f"expected a JSON object, got {type(data).__name__}")
    if "message" not in data:
        return ErrorFileRead(None, 'no "message" field')
    if not isinstance(data["message"], str | dict):
        return ErrorFileRead(None, '"message" is neither a string nor an object')
    return ErrorFileRead(data, None)


class ErrorHandler:
    """Writes the exception that ends a process to ``TORCHELASTIC_ERROR_FILE`` as JSON.

    When the variable is unset, nothing is written (torch's behaviour).  Subclasses may
    override :meth:`initialize`, :meth:`record_exception`, :meth:`record_success` and
    :meth:`maybe_enrich_signal_failure_message` (torch's extension points).
    """

    #: the qualified name of the ``@record``-decorated entrypoint, once told; only logged
    _fn_name: str | None = None

    def set_entrypoint_fn_name(self, fn_name: str | None) -> None:
        """Name the entrypoint this handler records for (``@record`` does), so that its
        log lines say which function failed or returned.  The error file is unchanged."""
        self._fn_name = fn_name

    def record_success(self) -> None:
        """The entrypoint returned without raising (``@record`` calls this).  Writes no
        file; logs at debug level when the entrypoint's name is known."""
        if self._fn_name:
            logger.debug("entrypoint %s returned without an error", self._fn_name)

    def maybe_enrich_signal_failure_message(self, message: str, error_file: str) -> str:
        """The text shown for a worker killed by a signal (it has no traceback), given
        the failure's message and error file.  This handler adds nothing; a subclass may
        append context it finds next to ``error_file`` (device faults, say).  Called while
        a report is rendered; the failure itself is not changed."""
        return message

    def _get_error_file_path(self) -> str | None:
        """The file to write, or None to write nothing."""
        return os.environ.get("TORCHELASTIC_ERROR_FILE", None)

    def initialize(self) -> None:
        """Enable ``faulthandler`` so that a crash in native code still prints stacks."""
        try:
            faulthandler.enable(all_threads=True)
        except Exception as e:  # e.g. sys.stderr replaced by an object without fileno()
            warnings.warn(f"Unable to enable fault handler. {type(e).__name__}: {e}", stacklevel=2)

    def _write_error_file(self, file_path: str, error_msg: str) -> None:
        """Write ``error_msg`` to ``file_path`` atomically; warn (never raise) on failure."""
        tmp = f"{file_path}.{os.getpid()}.tmp"
        try:
            with open(tmp, "w", encoding="utf-8") as fp:
                fp.write(error_msg)
            os.replace(tmp, file_path)
        except OSError as e:
            warnings.warn(f"Unable to write error to file. {type(e).__name__}: {e}", stacklevel=2)
            with contextlib.suppress(OSError):
                os.remove(tmp)

    def record_exception(self, e: BaseException) -> None:
        """Write ``e`` (with the traceback being handled) in torch's error-file format."""
        if self._fn_name:
            logger.debug("entrypoint %s raised %s", self._fn_name, type(e).__name__)
        file = self._get_error_file_path()
        if file:
            data = {
                "message": {
                    "message": f"{type(e).__name__}: {e}",
                    "extraInfo": {
                        "py_callstack": traceback.format_exc(),
                        "timestamp": str(int(time.time())),
                    },
                }
            }
            self._write_error_file(file, json.dumps(data))

    def override_error_code_in_rootcause_data(
        self,
        rootcause_error_file: str,
        rootcause_error: dict[str, Any],
        error_code: int = 0,
    ) -> None:
        """Set ``errorCode`` in the root cause's data (old, object-message format only)."""
        if "message" not in rootcause_error:
            logger.warning(
                "child error file (%s) does not have field `message`. \n"
                "cannot override error code: %s",
                rootcause_error_file,
                error_code,
            )
        elif isinstance(rootcause_error["message"], str):
            logger.warning(
                "child error file (%s) has a new message format. \nskipping error code override",
                rootcause_error_file,
            )
        else:
            rootcause_error["message"]["errorCode"] = error_code

    def dump_error_file(self, rootcause_error_file: str, error_code: int = 0) -> None:
        """Copy the child's error file into our own, with ``errorCode`` set if non-zero.

        The child's exit code is set here because a child killed by a signal cannot
        record it itself.  A child file that cannot be read is logged and not copied.
        """
        read = read_error_file(rootcause_error_file)
        if read.data is None:
            logger.warning(
                "child error file (%s) not copied: %s", rootcause_error_file, read.problem
            )
            return
        rootcause_error = read.data
        if error_code:
            self.override_error_code_in_rootcause_data(
                rootcause_error_file, rootcause_error, error_code
            )
        my_error_file = self._get_error_file_path()
        if my_error_file:
            # Our file may already exist: a child started with multiprocessing inherits
            # our TORCHELASTIC_ERROR_FILE until its wrapper sets its own, and a signal in
            # that window makes it write to ours.  Keep the old contents in the log.
            self._rm(my_error_file)
            self._write_error_file(my_error_file, json.dumps(rootcause_error))
            logger.info("dumped error file to parent's %s", my_error_file)
        else:
            logger.error(
                "no error file defined for parent, to copy child error file (%s)",
                rootcause_error_file,
            )

    def _rm(self, my_error_file: str) -> None:
        if not os.path.isfile(my_error_file):
            return
        old = read_error_file(my_error_file)
        if old.data is not None:
            logger.warning(
                "%s already exists and will be overwritten. Original contents:\n%s",
                my_error_file,
                json.dumps(old.data, indent=2),
            )
        else:
            logger.warning(
                "%s already exists and will be overwritten. Unable to load original contents: %s",
                my_error_file,
                old.problem,
            )
        try:
            os.remove(my_error_file)
        except OSError as e:
            logger.warning("could not remove %s: %s", my_error_file, e)
