"""torch's TailLog and redirects, for programs that use them directly."""

from __future__ import annotations

import ctypes
import io
import os
import sys
import threading
from pathlib import Path

import pytest

from elastic.multiprocessing.redirects import redirect, redirect_stderr, redirect_stdout
from elastic.multiprocessing.tail_log import TailLog


def _write_lines(path: Path, n: int) -> None:
    with open(path, "w") as fp:
        for i in range(n):
            print(i, file=fp, flush=True)


def _parse(text: str) -> dict[str, set[int]]:
    out: dict[str, set[int]] = {}
    for line in text.splitlines():
        header, num = line.rsplit(":", 1)
        out.setdefault(header + ":", set()).add(int(num))
    return out


def test_tail_copies_every_line_of_files_created_after_start_with_their_headers(
    tmp_path: Path,
) -> None:
    files = {r: str(tmp_path / f"{r}.log") for r in range(4)}
    dst = io.StringIO()
    tail = TailLog("w", files, dst, interval_sec=0.001).start()
    writers = [threading.Thread(target=_write_lines, args=(Path(f), 200)) for f in files.values()]
    for t in writers:
        t.start()
    for t in writers:
        t.join(60)
    assert not tail.stopped()
    tail.stop()
    assert tail.stopped()
    assert _parse(dst.getvalue()) == {f"[w{r}]:": set(range(200)) for r in range(4)}


def test_tail_uses_given_prefixes_and_drops_filtered_lines(tmp_path: Path) -> None:
    files = {r: str(tmp_path / f"{r}.log") for r in range(2)}
    for f in files.values():
        _write_lines(Path(f), 30)
    dst = io.StringIO()
    tail = TailLog(
        "w",
        files,
        dst,
        log_line_prefixes={1: "[custom1]:"},
        interval_sec=0.001,
        log_line_filter=lambda line: "2" in line,
    ).start()
    tail.stop()
    assert _parse(dst.getvalue()) == {
        "[w0]:": {2, 12, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29},
        "[custom1]:": {2, 12, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29},
    }


def test_tail_writes_to_a_path_destination(tmp_path: Path) -> None:
    src = tmp_path / "0.log"
    _write_lines(src, 5)
    dst = tmp_path / "out.log"
    TailLog("w", {0: str(src)}, str(dst), interval_sec=0.001).start().stop()
    assert _parse(dst.read_text()) == {"[w0]:": set(range(5))}


def test_tail_stops_when_a_file_never_appears_and_with_no_files(tmp_path: Path) -> None:
    tail = TailLog("w", {0: str(tmp_path / "never.log")}, io.StringIO(), interval_sec=0.001)
    tail.start().stop()
    assert tail.stopped()
    empty = TailLog("w", {}, io.StringIO()).start()
    assert not empty.stopped()
    empty.stop()
    assert empty.stopped()


def test_tail_logs_an_error_in_one_reader_and_still_stops(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    tail = TailLog("w", {0: str(tmp_path)}, io.StringIO(), interval_sec=0.001).start()
    tail.stop()  # a directory cannot be read as lines
    assert tail.stopped()
    assert any("error in log tailer for w0" in r.getMessage() for r in caplog.records)


libc = ctypes.CDLL("libc.so.6")


def test_redirect_refuses_an_unknown_stream(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="stdfoo"), redirect("stdfoo", str(tmp_path / "x.log")):
        pass


@pytest.mark.parametrize("std", ["stdout", "stderr"])
def test_redirect_captures_fd_c_and_python_writes_in_the_block_only(
    tmp_path: Path, std: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    fd = 1 if std == "stdout" else 2
    c_stream = ctypes.c_void_p.in_dll(libc, std)
    log = tmp_path / f"{std}.log"
    # the process's own stream (pytest swaps in an in-memory one): a buffered print must
    # reach the file, so redirect has to flush it at the end of the block
    real = open(fd, "w", buffering=4096, closefd=False)  # noqa: SIM115
    monkeypatch.setattr(sys, std, real)
    os.write(fd, b"before\n")
    libc.fprintf(c_stream, b"c before\n")
    ctx = redirect_stdout(str(log)) if std == "stdout" else redirect_stderr(str(log))
    with ctx:
        os.write(fd, b"from fd\n")
        libc.fprintf(c_stream, b"from c\n")
        print("from python", file=real)
    os.write(fd, b"after\n")
    libc.fprintf(c_stream, b"c after\n")
    libc.fflush(c_stream)
    monkeypatch.undo()
    real.close()
    assert set(log.read_text().splitlines()) == {"from fd", "from c", "from python"}
