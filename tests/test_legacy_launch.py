"""torch's legacy launcher (``python -m elastic.launch``) and ``elastic.run``'s
programmatic names (``parse_args``, ``run``, ``get_use_env``, ``config_from_args``).

Older scripts read ``--local-rank`` from their arguments: without ``--use-env`` each
worker gets ``--local-rank=<its local rank>`` before the script's arguments.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest

import elastic.launch
import elastic.run
from elastic.run_args import config_from_args
from tests.test_run_cli import TAG, tag  # noqa: F401  # the fixture

SCRIPT = """
import argparse, os, sys
p = argparse.ArgumentParser()
p.add_argument("--local-rank", "--local_rank", type=int, default=None)
p.add_argument("--out", required=True)
a = p.parse_args()
with open(os.path.join(a.out, "r" + os.environ["LOCAL_RANK"]), "w") as f:
    f.write(repr(a.local_rank) + " " + " ".join(sys.argv[1:]))
"""


def _out(tmp_path: Path) -> Path:
    out = tmp_path / "out"
    out.mkdir()
    return out


def _written(out: Path) -> dict[str, str]:
    """What each worker wrote: its --local-rank (None if not given) and its arguments."""
    return {p.name: p.read_text() for p in out.iterdir()}


def _script(tmp_path: Path) -> Path:
    s = tmp_path / "script.py"
    s.write_text(SCRIPT)
    return s


def test_without_use_env_the_rank_macro_comes_before_the_script_arguments() -> None:
    ns = elastic.launch.parse_args(["--nproc-per-node", "2", "train.py", "--lr", "1"])
    assert ns.use_env is False and not elastic.run.get_use_env(ns)
    _, cmd, args = config_from_args(ns)
    assert cmd == sys.executable
    assert args == ["-u", "train.py", "--local-rank=${local_rank}", "--lr", "1"]


def test_use_env_in_either_spelling_passes_no_rank_argument() -> None:
    for flag in ("--use-env", "--use_env"):
        ns = elastic.launch.parse_args([flag, "train.py"])
        assert elastic.run.get_use_env(ns)
        assert config_from_args(ns)[2] == ["-u", "train.py"]


def test_torchrun_namespaces_use_the_environment() -> None:
    ns = elastic.run.parse_args(["train.py"])
    assert not hasattr(ns, "use_env") and elastic.run.get_use_env(ns)
    assert "--local-rank=${local_rank}" not in config_from_args(ns)[2]


def test_no_python_needs_use_env() -> None:
    ns = elastic.launch.parse_args(["--no-python", "prog"])
    with pytest.raises(ValueError, match="'--use-env'"):
        elastic.launch.launch(ns)


def test_run_takes_a_namespace_not_a_list() -> None:
    with pytest.raises(TypeError, match="main\\(args\\)"):
        elastic.run.run(["train.py"])  # type: ignore[arg-type]


def test_elastic_run_exposes_torchs_module_names() -> None:
    for name in ("get_args_parser", "parse_args", "config_from_args", "run", "main"):
        assert callable(getattr(elastic.run, name)), name
    assert isinstance(elastic.run.get_args_parser(), argparse.ArgumentParser)
    with pytest.raises(AttributeError):
        _ = elastic.run.no_such_name  # type: ignore[attr-defined]


@pytest.mark.timeout(90)
def test_main_warns_then_every_worker_reads_its_rank_from_its_arguments(
    tmp_path: Path,
    tag: str,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(TAG, tag)
    out = _out(tmp_path)
    args = ["--nproc-per-node", "2", "--monitor-interval", "0.1"]
    with pytest.warns(FutureWarning, match="torch.distributed.launch is deprecated"):
        elastic.launch.main([*args, str(_script(tmp_path)), "--out", str(out)])
    assert _written(out) == {
        "r0": f"0 --local-rank=0 --out {out}",
        "r1": f"1 --local-rank=1 --out {out}",
    }


@pytest.mark.timeout(90)
def test_run_with_parsed_arguments_launches_with_the_rank_in_the_environment_only(
    tmp_path: Path,
    tag: str,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(TAG, tag)
    out = _out(tmp_path)
    script = str(_script(tmp_path))
    ns = elastic.run.parse_args(["--nproc-per-node", "2", script, "--out", str(out)])
    elastic.run.run(ns)
    assert _written(out) == {
        "r0": f"None --out {out}",
        "r1": f"None --out {out}",
    }


@pytest.mark.timeout(90)
def test_the_module_command_line(tmp_path: Path, tag: str) -> None:  # noqa: F811
    out = _out(tmp_path)
    env = dict(os.environ, **{TAG: tag})
    script = str(_script(tmp_path))
    p = subprocess.run(
        [sys.executable, "-m", "elastic.launch", "--nproc-per-node", "1", script, "--out",
         str(out)],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    assert "FutureWarning" in p.stderr
    assert (out / "r0").read_text() == f"0 --local-rank=0 --out {out}"
    bad = subprocess.run(
        [sys.executable, "-m", "elastic.launch", "--no-python", "/bin/true"],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert bad.returncode == 2
    assert bad.stderr.splitlines()[-1].startswith("python -m elastic.launch: error: --no-python")
    assert "Traceback" not in bad.stderr
