"""torch's newer ErrorHandler extension points: the entrypoint's name, a success hook, and
the hook that may add context to a signal failure's report."""

from __future__ import annotations

import json
import logging
import signal
from pathlib import Path

import pytest

from elastic.multiprocessing import errors
from elastic.multiprocessing.errors import ChildFailedError, ErrorHandler, ProcessFailure, record

LOGGER = "elastic.multiprocessing.errors.error_handler"


class Spy(ErrorHandler):
    def __init__(self) -> None:
        self.calls: list[str] = []

    def record_success(self) -> None:
        self.calls.append(f"success:{self._fn_name}")
        super().record_success()

    def record_exception(self, e: BaseException) -> None:
        self.calls.append(f"exception:{type(e).__name__}")
        super().record_exception(e)


def named_entrypoint(fail: bool) -> int:
    if fail:
        raise KeyError("k")
    return 7


def test_record_names_the_entrypoint_and_reports_a_return_as_success() -> None:
    spy = Spy()
    wrapped = record(named_entrypoint, spy)
    assert wrapped(False) == 7
    assert spy.calls == ["success:named_entrypoint"]
    with pytest.raises(KeyError):
        wrapped(True)
    assert spy.calls[-1] == "exception:KeyError"  # no success after a failure


def test_exit_zero_is_neither_a_success_nor_a_failure_to_the_hooks() -> None:
    spy = Spy()

    def leaves() -> None:
        raise SystemExit(0)

    assert record(leaves, spy)() is None
    assert spy.calls == []


def test_a_success_hook_that_raises_is_not_recorded_as_the_entrypoints_failure() -> None:
    class Broken(Spy):
        def record_success(self) -> None:
            raise RuntimeError("hook")

    broken = Broken()
    with pytest.raises(RuntimeError, match="hook"):
        record(named_entrypoint, broken)(False)
    assert broken.calls == []


def test_the_name_is_logged_never_written_to_the_error_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    file = tmp_path / "error.json"
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(file))
    eh = ErrorHandler()
    eh.set_entrypoint_fn_name("train_loop")
    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        eh.record_success()
        assert not file.exists()
        eh.record_exception(ValueError("v"))
    assert sum("train_loop" in r.getMessage() for r in caplog.records) == 2
    assert "train_loop" not in file.read_text()
    assert json.loads(file.read_text())["message"]["message"] == "ValueError: v"


def test_without_a_name_success_logs_nothing(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        ErrorHandler().record_success()
    assert caplog.records == []


def test_the_signal_hook_enriches_the_report_not_the_failure(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    seen: list[str] = []

    class Enriching(ErrorHandler):
        def maybe_enrich_signal_failure_message(self, message: str, error_file: str) -> str:
            seen.append(error_file)
            return message + "\n[xid 79 near the crash]"

    monkeypatch.setattr(errors, "get_error_handler", Enriching)
    killed = ProcessFailure(0, 11, -int(signal.SIGSEGV), str(tmp_path / "none.json"))
    failed = ProcessFailure(1, 12, 1, str(tmp_path / "none.json"))
    report = str(ChildFailedError("trainer", {0: killed, 1: failed}))
    assert "[xid 79 near the crash]" in report
    assert "xid" not in str(killed.message)
    assert len(seen) == 1  # only the failure by a signal was offered to the hook


def test_the_base_signal_hook_changes_nothing(tmp_path: Path) -> None:
    assert ErrorHandler().maybe_enrich_signal_failure_message("m", "f") == "m"
