"""The simulator's side of warm restarts: ``job.preload_saves`` and calibration files."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from elastic.errors import ConfigError
from sim.calibration import Calibration, apply_calibration, load_calibration
from sim.run import simulate
from sim.scenario import load_scenario_text

SCENARIO = """
name: a worker crash, startup 20 s
seed: 1
until: 6h
cluster: {nodes: 2, nproc_per_node: 2}
job:
  steps: 1500
  step_time: 2s
  startup_time: 20s
  checkpoint_every: 10
  checkpoint_time: 1s
  %s
agent: {max_restarts: 3}
faults:
  - {at: 10m, kind: worker_crash, node: 1, local_rank: 1, exit_code: 1}
  - {at: 30m, kind: worker_crash, node: 0, local_rank: 0, exit_code: 1}
"""


def _sc(extra: str = "") -> object:
    return load_scenario_text(SCENARIO % extra, name="s.yaml")


def test_preload_saves_is_read_checked_and_written_back() -> None:
    sc = load_scenario_text(SCENARIO % "preload_saves: 4s", name="s.yaml")
    assert sc.job.preload_saves == 4.0
    assert "preload_saves: 4s" in sc.to_yaml()
    assert load_scenario_text(SCENARIO % "", name="s.yaml").job.preload_saves is None
    with pytest.raises(ConfigError) as e:
        load_scenario_text(SCENARIO % "preload_saves: 25s", name="s.yaml")
    assert str(e.value) == (
        "s.yaml:12: job.preload_saves: got 25s; expected at most the job's startup_time "
        "(20s), the part a preload removes"
    )


def test_each_recovery_is_shorter_by_what_the_preload_saves() -> None:
    cold = simulate(load_scenario_text(SCENARIO % "", name="s.yaml")).report
    warm = simulate(load_scenario_text(SCENARIO % "preload_saves: 4s", name="s.yaml")).report
    assert cold["recovery_count"] == warm["recovery_count"] == 2
    for c, w in zip(cold["recovery_s"], warm["recovery_s"], strict=True):
        assert c - w == pytest.approx(4.0)
    assert warm["goodput"] > cold["goodput"]


def test_a_calibration_file_supplies_the_default_and_never_overrides(tmp_path: Path) -> None:
    cal_file = tmp_path / "warm.json"
    cal_file.write_text(json.dumps({"preload_saves": 5.25, "restart_torchrun": 7.1}))
    cal = load_calibration(cal_file)
    assert cal == Calibration(preload_saves=5.25)
    unsaid = load_scenario_text(SCENARIO % "", name="s.yaml")
    assert apply_calibration(unsaid, cal).job.preload_saves == 5.25
    said = load_scenario_text(SCENARIO % "preload_saves: 1s", name="s.yaml")
    assert apply_calibration(said, cal).job.preload_saves == 1.0
    # never more than the job's own startup
    big = dataclasses.replace(cal, preload_saves=60.0)
    assert apply_calibration(unsaid, big).job.preload_saves == 20.0


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("[1]", "got a JSON list; expected an object"),
        ("{", "not JSON"),
        ('{"preload_saves": -1}', "preload_saves: got -1; expected seconds (a number >= 0)"),
        ('{"preload_saves": "2s"}', "preload_saves: got '2s'; expected seconds"),
        ('{"preload_saves": true}', "preload_saves: got True; expected seconds"),
    ],
)
def test_bad_calibration_files_are_one_line(tmp_path: Path, content: str, message: str) -> None:
    f = tmp_path / "c.json"
    f.write_text(content)
    with pytest.raises(ConfigError, match=None) as e:
        load_calibration(f)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_sim_cli_takes_a_calibration_and_refuses_a_bad_one(tmp_path: Path) -> None:
    sc = tmp_path / "s.yaml"
    sc.write_text(SCENARIO % "")
    cal = tmp_path / "c.json"
    cal.write_text('{"preload_saves": 4}')
    run = [sys.executable, "-m", "elastic.cli", "sim", str(sc), "--json"]
    cold = json.loads(subprocess.run(run, capture_output=True, text=True, timeout=60).stdout)
    p = subprocess.run(
        [*run, "--calibration", str(cal)], capture_output=True, text=True, timeout=60
    )
    warm = json.loads(p.stdout)
    assert [
        round(c - w, 6) for c, w in zip(cold["recovery_s"], warm["recovery_s"], strict=True)
    ] == [
        4.0,
        4.0,
    ]
    cal.write_text("[]")
    p = subprocess.run(
        [*run, "--calibration", str(cal)], capture_output=True, text=True, timeout=60
    )
    assert p.returncode == 2
    assert (
        p.stderr.strip()
        == f"elastic sim: --calibration: {cal}: got a JSON list; expected an object"
    )
