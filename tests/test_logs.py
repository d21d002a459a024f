"""Log layout and console prefixes: ``Std``, ``DefaultLogsSpecs`` and the line prefixer."""

from __future__ import annotations

import os
from enum import IntFlag
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from elastic.multiprocessing import DefaultLogsSpecs, Std, to_map
from elastic.multiprocessing.tail import LinePrefixer, TeeSink, default_header


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0", Std.NONE),
        ("3", Std.ALL),
        ("0:1,1:2", {0: Std.OUT, 1: Std.ERR}),
        ("10:3,2:0", {10: Std.ALL, 2: Std.NONE}),  # torch refuses two-digit ranks
    ],
)
def test_std_from_str_accepts_values_and_rank_maps(text: str, expected: object) -> None:
    assert Std.from_str(text) == expected


@pytest.mark.parametrize("text", ["4", "", "0:4", "a:1", "0:1,", "1,2", "-1"])
def test_std_from_str_refuses_junk_with_the_value_and_the_expected_form(text: str) -> None:
    with pytest.raises(ValueError, match="expected one of 0,1,2,3") as info:
        Std.from_str(text)
    assert repr(text) in str(info.value)


def test_std_is_torchs_flag_enum() -> None:
    assert (Std.NONE, Std.OUT, Std.ERR, Std.ALL) == (0, 1, 2, 3)
    assert Std.OUT | Std.ERR is Std.ALL


def test_to_map_fills_missing_ranks_with_none() -> None:
    assert to_map(Std.OUT, 2) == {0: Std.OUT, 1: Std.OUT}
    assert to_map({1: Std.ERR}, 3) == {0: Std.NONE, 1: Std.ERR, 2: Std.NONE}


def test_to_map_takes_another_modules_std_flag_as_a_value_not_a_map() -> None:
    class OtherStd(IntFlag):
        NONE = 0
        OUT = 1

    result = to_map(OtherStd.OUT, 2)  # type: ignore[arg-type]
    assert result == {0: Std.OUT, 1: Std.OUT}
    assert all(type(v) is Std for v in result.values())


def _envs(n: int, attempt: int = 0) -> dict[int, dict[str, str]]:
    return {
        r: {"TORCHELASTIC_RUN_ID": "job", "TORCHELASTIC_RESTART_COUNT": str(attempt)}
        for r in range(n)
    }


def test_layout_is_run_dir_attempt_rank_and_sets_error_file(tmp_path: Path) -> None:
    specs = DefaultLogsSpecs(str(tmp_path / "new"), redirects=Std.OUT, tee={1: Std.ERR})
    envs = _envs(2, attempt=3)
    dest = specs.reify(envs)
    assert specs.run_log_dir is not None
    run = Path(specs.run_log_dir)
    assert run.parent == tmp_path / "new" and run.name.startswith("job_")
    rank = [run / "attempt_3" / str(r) for r in range(2)]
    assert dest.stdouts == {0: str(rank[0] / "stdout.log"), 1: str(rank[1] / "stdout.log")}
    assert dest.stderrs == {0: "", 1: str(rank[1] / "stderr.log")}  # tee implies redirect
    assert dest.tee_stdouts == {}
    assert dest.tee_stderrs == {1: str(rank[1] / "stderr.log")}
    assert dest.error_files == {r: str(rank[r] / "error.json") for r in range(2)}
    assert [envs[r]["TORCHELASTIC_ERROR_FILE"] for r in range(2)] == [
        str(rank[r] / "error.json") for r in range(2)
    ]
    assert dest.filtered_stdout == str(run / "attempt_3" / "filtered_stdout.log")
    assert dest.attempt_dir == str(run / "attempt_3")


def test_every_attempt_keeps_its_own_directory_in_one_run_dir(tmp_path: Path) -> None:
    specs = DefaultLogsSpecs(str(tmp_path))
    specs.reify(_envs(1, 0))
    (Path(specs.run_log_dir or "") / "attempt_0" / "0" / "stdout.log").write_text("failed")
    specs.reify(_envs(1, 1))
    run = Path(specs.run_log_dir or "")
    assert sorted(p.name for p in run.iterdir()) == ["attempt_0", "attempt_1"]
    assert (run / "attempt_0" / "0" / "stdout.log").read_text() == "failed"


def test_ranks_outside_the_filter_lose_the_console_but_keep_their_files(tmp_path: Path) -> None:
    specs = DefaultLogsSpecs(str(tmp_path), tee=Std.OUT, local_ranks_filter={0})
    dest = specs.reify(_envs(2))
    assert set(dest.tee_stdouts) == {0}
    assert dest.stdouts[1].endswith("1/stdout.log")  # still written to its file
    assert dest.stderrs == {0: "", 1: os.devnull}  # not redirected, not shown


def test_devnull_log_dir_writes_nothing(tmp_path: Path) -> None:
    specs = DefaultLogsSpecs(os.devnull, redirects=Std.ALL)
    envs = _envs(2)
    dest = specs.reify(envs)
    assert dest.error_files == {0: os.devnull, 1: os.devnull}
    assert envs[0]["TORCHELASTIC_ERROR_FILE"] == ""
    assert specs.run_log_dir is None
    assert dest.attempt_dir is None


def test_log_dir_that_is_a_file_is_refused(tmp_path: Path) -> None:
    f = tmp_path / "file"
    f.write_text("")
    with pytest.raises(NotADirectoryError, match="is a file"):
        DefaultLogsSpecs(str(f))


@pytest.mark.torch
def test_layout_matches_torchs_default_logs_specs(tmp_path: Path) -> None:
    torch_api = pytest.importorskip("torch.distributed.elastic.multiprocessing.api")
    cases: list[dict[str, Any]] = [
        {"redirects": Std.ALL},
        {"tee": Std.ALL, "local_ranks_filter": {1}},
        {"redirects": {0: Std.OUT}, "tee": {2: Std.ERR}},
    ]
    for i, kw in enumerate(cases):
        ours = DefaultLogsSpecs(str(tmp_path / f"ours{i}"), **kw)
        theirs_kw = {
            k: (
                torch_api.Std(int(v))
                if isinstance(v, Std)
                else {r: torch_api.Std(int(s)) for r, s in v.items()}
                if isinstance(v, dict)
                else v
            )
            for k, v in kw.items()
        }
        theirs = torch_api.DefaultLogsSpecs(str(tmp_path / f"theirs{i}"), **theirs_kw)
        a, b = ours.reify(_envs(3)), theirs.reify(_envs(3))
        root_a, root_b = str(ours.run_log_dir), str(theirs._run_log_dir)
        for field in ("stdouts", "stderrs", "tee_stdouts", "tee_stderrs", "error_files"):
            mine = {r: p.replace(root_a, "R") for r, p in getattr(a, field).items()}
            torchs = {r: p.replace(root_b, "R") for r, p in getattr(b, field).items()}
            assert mine == torchs, (kw, field)


# -- console prefixes ----------------------------------------------------------------------


def test_default_header_is_torchs() -> None:
    assert default_header("default", 0) == "[default0]:"


def test_a_line_split_across_chunks_gets_one_header() -> None:
    p = LinePrefixer(b"[w0]:")
    assert p.feed(b"par") == b"[w0]:par"
    assert p.feed(b"tial\nnext") == b"tial\n[w0]:next"
    assert p.feed(b"\n") == b"\n"
    assert p.feed(b"") == b""
    assert p.feed(b"\n\nx") == b"[w0]:\n[w0]:\n[w0]:x"


@given(st.lists(st.binary(max_size=20), max_size=10))
def test_prefixing_does_not_depend_on_how_output_is_chunked(chunks: list[bytes]) -> None:
    whole = b"".join(chunks)
    p = LinePrefixer(b"H:")
    chunked = b"".join(p.feed(c) for c in chunks)
    # only "\n" ends a line ("\r" is a progress bar redrawing its line)
    lines = [piece + b"\n" for piece in whole.split(b"\n")[:-1]] + [whole.split(b"\n")[-1]]
    expected = b"".join(b"H:" + line for line in lines if line)
    assert chunked == expected == LinePrefixer(b"H:").feed(whole)


class _Sink:
    def __init__(self) -> None:
        self.data = b""
        self.closed = False

    def write(self, data: bytes, /) -> int:
        self.data += data
        return len(data)

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True


def test_tee_sink_writes_raw_bytes_to_the_file_and_prefixed_lines_to_the_console() -> None:
    file, console = _Sink(), _Sink()
    tee = TeeSink(file, console, "[t1]:")
    tee.feed(b"a\nb")
    tee.feed(b"c\n")
    tee.close()
    assert file.data == b"a\nbc\n" and file.closed
    assert console.data == b"[t1]:a\n[t1]:bc\n" and not console.closed


def test_tee_sink_holds_a_partial_line_until_its_newline_or_close() -> None:
    file, console = _Sink(), _Sink()
    tee = TeeSink(file, console, "[t1]:")
    tee.feed(b"one\ntw")
    assert console.data == b"[t1]:one\n"  # "tw" is not on the console yet
    tee.feed(b"o")
    assert console.data == b"[t1]:one\n"
    tee.feed(b"\nthree")
    assert console.data == b"[t1]:one\n[t1]:two\n"
    tee.close()
    assert console.data == b"[t1]:one\n[t1]:two\n[t1]:three\n"
    assert file.data == b"one\ntwo\nthree"  # the file keeps the bytes as written


def test_tee_sink_writes_an_overlong_line_in_whole_pieces() -> None:
    from elastic.multiprocessing.tail import MAX_HELD_LINE

    writes: list[bytes] = []

    class _Console(_Sink):
        def write(self, data: bytes, /) -> int:
            writes.append(data)
            return super().write(data)

    tee = TeeSink(None, _Console(), "[t]:")
    for _ in range(3):
        tee.feed(b"x" * (MAX_HELD_LINE // 2 + 1))
    tee.feed(b"y\n")
    tee.close()
    assert all(w.endswith(b"\n") and w.startswith(b"[t]:") for w in writes)
    assert (
        b"".join(w[len(b"[t]:") : -1] for w in writes) == b"x" * 3 * (MAX_HELD_LINE // 2 + 1) + b"y"
    )
