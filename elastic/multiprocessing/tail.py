"""The console tee: a worker's output chunks go to its log file and, prefixed, to the console.

Theory of operation
-------------------
torch tails each log file with one polling thread (``TailLog``: ``readline`` then sleep
0.1 s at end of file), and a line that is still being written when it reaches the end of
the file is printed with a header and its remainder again with a second header.  Here the
launcher reads the worker's pipe when the kernel says it is readable and hands each chunk
to :meth:`TeeSink.feed`, which writes the chunk to the file unchanged and to the console
with the header at the start of every *line* — a line split across chunks gets one
header.  The console gets only whole lines, each write ending with ``\n``: every rank's
stdout and stderr share the terminal, and a line written in two pieces would let another
rank's line land between them (``[default0]:…[default1]:…`` on one console line).  A
partial line is held until its newline arrives, the stream ends, or it reaches
:data:`MAX_HELD_LINE` bytes (then it is written as a line of its own and continued, with
a header, on the next).  Nothing here waits or polls; the caller owns the pipe.

:class:`LinePrefixer` is the pure part (bytes in, bytes out) and is what the tests pin.
"""

from __future__ import annotations

from typing import Protocol

__all__ = ["MAX_HELD_LINE", "ByteSink", "LinePrefixer", "TeeSink", "default_header"]

#: The longest partial line the console tee holds back waiting for its newline.
MAX_HELD_LINE = 64 * 1024


class ByteSink(Protocol):
    """Where bytes go: a binary file, or the agent's console."""

    def write(self, data: bytes, /) -> int: ...

    def flush(self) -> None: ...


def default_header(role: str, local_rank: int) -> str:
    """torch's default console prefix: ``[<role><local_rank>]:`` (e.g. ``[default0]:``)."""
    return f"[{role}{local_rank}]:"


class LinePrefixer:
    """Puts ``header`` at the start of each line of a byte stream fed in arbitrary chunks.

    Guarantee: the concatenation of all outputs equals the input with ``header`` inserted
    before the first byte of every line (a line starts at the stream's start and after
    every ``\\n``); a header is written only once the line's first byte has arrived.
    """

    __slots__ = ("_at_line_start", "_header")

    def __init__(self, header: bytes) -> None:
        self._header = header
        self._at_line_start = True

    def feed(self, chunk: bytes) -> bytes:
        """The prefixed form of ``chunk``, given everything fed before it."""
        if not chunk:
            return b""
        lines = chunk.split(b"\n")
        # split gives an empty last piece when the chunk ends with a newline: that next
        # line has not started yet, so it must not get its header now
        out = bytearray()
        for i, piece in enumerate(lines):
            last = i == len(lines) - 1
            if last and not piece:
                break
            if self._at_line_start:
                out += self._header
            out += piece
            if not last:
                out += b"\n"
                self._at_line_start = True
            else:
                self._at_line_start = False
        return bytes(out)


class TeeSink:
    """Where one tee'd stream goes: ``file`` gets every byte, ``console`` the prefixed lines.

    ``file`` and ``console`` may be None (e.g. a rank outside ``local_ranks_filter`` still
    writes its file).  Each :meth:`feed` is flushed to the file at once so a crash loses
    nothing that the worker wrote.  The console gets whole lines only, in one write per
    feed (see the module's docstring); :meth:`close` writes a held partial line, ended
    with a newline.
    """

    def __init__(self, file: ByteSink | None, console: ByteSink | None, header: str) -> None:
        self._file = file
        self._console = console
        self._prefixer = LinePrefixer(header.encode())
        self._held = b""

    def feed(self, chunk: bytes) -> None:
        if self._file is not None:
            self._file.write(chunk)
            self._file.flush()
        if self._console is None or not chunk:
            return
        data = self._held + chunk
        cut = data.rfind(b"\n") + 1
        whole, self._held = data[:cut], data[cut:]
        if len(self._held) >= MAX_HELD_LINE:
            # a line this long is not held forever: it is written as a line of its own
            whole, self._held = whole + self._held + b"\n", b""
        if whole:
            self._console.write(self._prefixer.feed(whole))
            self._console.flush()

    def close(self) -> None:
        """Write a held partial line to the console; close the file (never the console)."""
        if self._console is not None and self._held:
            self._console.write(self._prefixer.feed(self._held + b"\n"))
            self._console.flush()
            self._held = b""
        if self._file is not None:
            close = getattr(self._file, "close", None)
            if close is not None:
                close()
            self._file = None
