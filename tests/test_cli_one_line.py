"""Every ``elastic`` plugin command answers a bad flag or a bad flag value in one line
(the command, the flag, the value, what was expected) and exits 2, as ``elastic sim`` and
``elastic run`` do: never argparse's usage block (sim/cliparse.py)."""

from __future__ import annotations

from importlib.metadata import entry_points
from pathlib import Path

import pytest

from elastic.cli import main
from sim.cliparse import plain

ROOT = Path(__file__).resolve().parent.parent
CLEAN = str(ROOT / "scenarios" / "clean_run.yaml")
COMMANDS = sorted(ep.name for ep in entry_points(group="elastic.commands"))

# per command: arguments with one bad value, and what the line must name
BAD_VALUES: dict[str, list[tuple[list[str], list[str]]]] = {
    "sim": [([CLEAN, "--seed", "abc"], ["--seed", "'abc'", "expected"])],
    "report": [([CLEAN, "--plot"], ["--plot", "expected one argument"])],
    "real": [
        ([CLEAN, "--time-scale", "fast"], ["--time-scale", "'fast'", "expected a number"]),
        ([CLEAN, "--seed", "x1"], ["--seed", "'x1'", "expected an integer"]),
    ],
    "compare": [
        ([CLEAN, "--tolerance", "ten"], ["--tolerance", "'ten'", "expected a number"]),
        ([CLEAN, "--seed", "-3"], ["--seed", "-3", "expected an integer"]),
    ],
    "calibrate": [(["--runs", "two"], ["--runs", "'two'", "expected an integer"])],
    "schema": [(["--output"], ["--output", "expected one argument"])],
    "sweep": [
        ([CLEAN, "--seeds", "abc"], ["--seeds", "'abc'", "expected an integer"]),
        ([CLEAN, "--jobs", "1.5"], ["--jobs", "'1.5'", "expected an integer"]),
    ],
    "minimize": [([CLEAN, "--max-runs", "many"], ["--max-runs", "'many'", "expected an integer"])],
}


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    try:
        code = main(argv)
    except SystemExit as e:  # argparse's exit
        code = int(e.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def test_every_plugin_command_has_bad_value_cases() -> None:
    assert set(BAD_VALUES) == set(COMMANDS)


@pytest.mark.parametrize("command", COMMANDS)
def test_an_unknown_flag_gives_one_line_and_exit_2(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = _run([command, CLEAN, "--no-such-flag"], capsys)
    assert code == 2 and out == ""
    (line,) = err.strip().splitlines()
    assert line.startswith(f"elastic {command}: ") and "--no-such-flag" in line
    assert "usage:" not in err


@pytest.mark.parametrize(
    ("command", "argv", "named"),
    [(c, argv, named) for c, cases in BAD_VALUES.items() for argv, named in cases],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_a_bad_flag_value_gives_one_line_naming_flag_value_and_expectation(
    command: str, argv: list[str], named: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = _run([command, *argv], capsys)
    assert code == 2 and out == ""
    (line,) = err.strip().splitlines()
    assert line.startswith(f"elastic {command}: "), line
    for text in named:
        assert text in line, (text, line)
    assert "usage:" not in err and "invalid int value" not in err


def test_argparse_messages_become_flag_value_expected() -> None:
    assert plain("argument --seeds: invalid int value: 'abc'") == (
        "--seeds: got 'abc'; expected an integer"
    )
    assert plain("argument --max-runs/--max_runs: invalid float value: 'x'") == (
        "--max-runs: got 'x'; expected a number"
    )
    assert plain("argument --seed: got 'a'; expected an integer ≥ 0") == (
        "--seed: got 'a'; expected an integer ≥ 0"
    )
    assert plain("argument -o/--output: expected one argument") == (
        "--output: expected one argument"
    )
    assert plain("unrecognized arguments: --x") == "unrecognized arguments: --x"


def test_argparse_choices_become_flag_value_expected() -> None:
    assert (
        plain(
            "argument --start-method/--start_method: invalid choice: 'zap' "
            "(choose from 'spawn', 'fork', 'forkserver')"
        )
        == "--start-method: got 'zap'; expected one of 'spawn', 'fork', 'forkserver'"
    )


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--max-restarts", "abc"], ["--max-restarts: got 'abc'; expected an integer"]),
        (["--monitor-interval", "x"], ["--monitor-interval: got 'x'; expected a number"]),
        (["--start-method", "zap"], ["--start-method: got 'zap'; expected one of 'spawn'"]),
        (["--node-rank", "1.5"], ["--node-rank: got '1.5'; expected an integer"]),
    ],
)
def test_elastic_run_answers_a_bad_flag_value_in_one_line(
    argv: list[str], named: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = _run(["run", *argv, "--no-python", "true"], capsys)
    assert code == 2 and out == ""
    (line,) = err.strip().splitlines()
    assert line.startswith("elastic run: error: "), line
    for text in named:
        assert text in line, (text, line)
    assert "invalid" not in line and "usage:" not in err


def test_elastic_run_names_the_known_backends_for_an_unknown_one(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, _out, err = _run(["run", "--rdzv-backend", "nope", "--no-python", "true"], capsys)
    assert code == 2
    line = err.strip().splitlines()[-1]
    assert line.startswith("elastic run: error: --rdzv-backend: got 'nope'; expected one of")
    assert "c10d" in line and "static" in line


def test_elastic_run_names_a_bad_rendezvous_setting_once(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, _out, err = _run(
        ["run", "--standalone", "--rdzv-conf", "last_call_timeout=abc", "--no-python", "true"],
        capsys,
    )
    assert code == 2
    line = err.strip().splitlines()[-1]
    assert line.startswith("elastic run: error: --rdzv-conf: "), line
    assert "--rdzv-backend" not in line and "last_call_timeout" in line
