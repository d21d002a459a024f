"""torch's threaded helpers in ``rendezvous.utils``: host matching, ``_delay``, ``_PeriodicTimer``.

They live in real mode (:mod:`elastic.real.rdzv_utils`); ``rendezvous.utils`` hands them out
by name without importing them itself.
"""

from __future__ import annotations

import gc
import socket
import subprocess
import sys
import threading
from datetime import timedelta

import pytest

from elastic.rendezvous import utils


def _timer_threads(name: str = "PeriodicTimer") -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == name]


def test_the_pure_module_does_not_import_the_real_helpers_until_asked() -> None:
    code = (
        "import sys, elastic.rendezvous.utils as u\n"
        "assert 'elastic.real.rdzv_utils' not in sys.modules\n"
        "u._PeriodicTimer\n"
        "assert 'elastic.real.rdzv_utils' in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_an_unknown_name_is_still_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        utils.nope  # noqa: B018


@pytest.mark.parametrize("host", ["localhost", "127.0.0.1", "127.0.0.2", "::1", "0:0:0:0:0:0:0:1"])
def test_every_loopback_spelling_names_this_machine(host: str) -> None:
    assert utils._matches_machine_hostname(host)


def test_this_machines_own_names_match() -> None:
    assert utils._matches_machine_hostname(socket.gethostname())
    assert utils._matches_machine_hostname(socket.getfqdn())


@pytest.mark.parametrize("host", ["no-such-host.invalid", "0.0.0.0", "::2"])
def test_other_hosts_and_the_wildcard_do_not_match(host: str) -> None:
    assert not utils._matches_machine_hostname(host)


def test_delay_skips_tiny_delays_and_draws_from_a_range(monkeypatch: pytest.MonkeyPatch) -> None:
    from elastic.real import rdzv_utils

    slept: list[float] = []
    monkeypatch.setattr(rdzv_utils.time, "sleep", slept.append)
    utils._delay(0.005)
    utils._delay(0.5)
    utils._delay((1.0, 2.0))
    assert slept[0] == 0.5
    assert 1.0 <= slept[1] <= 2.0 and len(slept) == 2


def test_timer_calls_its_function_with_its_arguments_until_cancelled() -> None:
    calls: list[tuple[int, str]] = []
    enough = threading.Event()

    def tick(n: int, word: str) -> None:
        calls.append((n, word))
        if len(calls) >= 3:
            enough.set()

    timer = utils._PeriodicTimer(timedelta(seconds=0.01), tick, 7, word="w")
    timer.start()
    assert enough.wait(60)
    timer.cancel()
    seen = len(calls)
    assert calls[0] == (7, "w")
    assert _timer_threads() == []
    assert len(calls) == seen  # nothing after cancel() returned


def test_timer_starts_once_and_is_named_before_it_starts() -> None:
    timer = utils._PeriodicTimer(timedelta(seconds=60), lambda: None)
    timer.set_name("keep-alive")
    assert timer.name == "keep-alive"
    timer.start()
    try:
        assert len(_timer_threads("keep-alive")) == 1
        assert all(t.daemon for t in _timer_threads("keep-alive"))
        with pytest.raises(RuntimeError, match=r"^The timer has already started\.$"):
            timer.start()
        with pytest.raises(RuntimeError, match=r"^The timer has already started\.$"):
            timer.set_name("other")
    finally:
        timer.cancel()
        timer.cancel()  # a second cancel is harmless
    assert _timer_threads("keep-alive") == []


def test_dropping_the_last_reference_stops_the_thread() -> None:
    timer = utils._PeriodicTimer(timedelta(seconds=60), lambda: None)
    timer.start()
    assert len(_timer_threads()) == 1
    del timer
    gc.collect()
    assert _timer_threads() == []


def test_cancel_before_start_does_nothing() -> None:
    utils._PeriodicTimer(timedelta(seconds=1), lambda: None).cancel()
