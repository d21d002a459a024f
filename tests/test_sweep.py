"""``elastic sweep``: every combination of settings and seeds, the same results whatever the
number of worker processes, distributions per setting, bad input refused in one line."""

from __future__ import annotations

import json
from pathlib import Path

import psutil
import pytest

from sim.sweep import main, parse_set, percentile, plot_sweep

SCENARIO = """
name: small sweep
seed: 11
until: 1d
cluster: {nodes: 4, nproc_per_node: 2}
job: {steps: 3000, step_time: 1s, startup_time: 20s, checkpoint_every: 100, checkpoint_time: 5s}
agent: {max_restarts: 100}
faults:
  - {kind: worker_crash, every: 15m}
expect:
  state: SUCCEEDED
"""


@pytest.fixture
def scenario(tmp_path: Path) -> Path:
    path = tmp_path / "s.yaml"
    path.write_text(SCENARIO, encoding="utf-8")
    return path


def _sweep(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, object]:
    assert main(list(argv)) == 0
    out: dict[str, object] = json.loads(capsys.readouterr().out)
    return out


@pytest.mark.timeout(120)
def test_results_are_the_same_on_one_or_two_worker_processes_and_none_is_left(
    scenario: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [str(scenario), "--seeds", "4", "--set", "job.checkpoint_every=50,300", "--json"]
    # other tests in this process may have left children of their own: only new ones count
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    one = _sweep(capsys, *argv, "--jobs", "1")
    two = _sweep(capsys, *argv, "--jobs", "2")
    assert one == two
    assert [p for p in psutil.Process().children(recursive=True) if p.pid not in before] == []
    settings = one["settings"]
    assert isinstance(settings, list) and [s["label"] for s in settings] == [
        "job.checkpoint_every=50",
        "job.checkpoint_every=300",
    ]
    assert one["seeds"] == [11, 12, 13, 14]
    for row in settings:
        assert [r["seed"] for r in row["runs"]] == [11, 12, 13, 14]
        goodputs = [r["goodput"] for r in row["runs"]]
        stats = row["stats"]["goodput"]
        assert stats["mean"] == pytest.approx(sum(goodputs) / 4, abs=1e-6)
        assert min(goodputs) <= stats["p5"] <= stats["p50"] <= stats["p95"] <= max(goodputs)
    # the seeds draw different crash times: the runs differ
    assert len({r["sim_time_s"] for r in settings[0]["runs"]}) > 1


def test_the_table_names_each_setting_and_the_best(
    scenario: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(
        [str(scenario), "--seeds", "2", "--set", "job.checkpoint_every=50,300", "--jobs", "1"]
    )
    out = capsys.readouterr().out
    assert code == 0
    assert "job.checkpoint_every=50  (2 SUCCEEDED)" in out
    assert "goodput" in out and "p95" in out
    assert "best by mean goodput: job.checkpoint_every=" in out


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["--set", "job.checkpoint_every=abc"], "--set: job.checkpoint_every=abc: job.checkpoint"),
        (["--set", "jb.steps=1"], "no section 'jb'"),
        (["--set", "job.steps"], "expected KEY=V1,V2,..."),
        (["--seeds", "0"], "--seeds: got 0"),
        (["--set", "job.steps=1", "--set", "job.steps=2"], "each key once"),
        (["--plot", "/nonexistent/dir/x.png"], "does not exist"),
    ],
)
def test_bad_input_is_refused_in_one_line(
    scenario: Path, capsys: pytest.CaptureFixture[str], argv: list[str], fragment: str
) -> None:
    assert main([str(scenario), *argv]) == 2
    err = capsys.readouterr().err
    assert fragment in err and err.count("\n") == 1, err


def test_percentiles_interpolate_like_numpy() -> None:
    values = [1.0, 2.0, 3.0, 4.0, 5.0]
    assert percentile(values, 50) == 3.0
    assert percentile(values, 5) == pytest.approx(1.2)
    assert percentile(values, 95) == pytest.approx(4.8)
    assert percentile([7.0], 95) == 7.0
    assert parse_set("job.checkpoint_every=1, 2") == ("job.checkpoint_every", ["1", "2"])


def test_plot_draws_the_spread(
    scenario: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    pytest.importorskip("matplotlib")
    out = tmp_path / "sweep.png"
    argv = [str(scenario), "--seeds", "2", "--set", "job.checkpoint_every=50,300"]
    assert main([*argv, "--jobs", "1", "--json", "--plot", str(out)]) == 0
    result = json.loads(capsys.readouterr().out)
    assert out.stat().st_size > 1000
    # every line, band and mark drawn is named in the legend (the p50 dashes were not)
    labels = plot_sweep(result, str(tmp_path / "again.png"))
    for name in ("goodput", "ettr"):
        for what in ("p5-p95", "mean", "median (p50)"):
            assert f"{name} {what}" in labels
