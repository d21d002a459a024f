"""Every command and example in README.md runs as printed, and the figures it quotes are
the output of the commands it names (issue 13 item 1).

Commands, the YAML example and the Python snippet are read from README.md itself (never
copied here), and run in a fresh directory where ``scenarios/`` and ``examples/`` are
this checkout's and the YAML example is saved as ``example.yaml`` — what the README says.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_run_cli import env_for, tag

__all__ = ["tag"]

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")
ELASTIC = [sys.executable, "-c", "from elastic.cli import entry; entry()"]


def _blocks(lang: str, text: str = README) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```", text, re.S | re.M)


def _section(title: str) -> str:
    start = README.index(f"## {title}\n")
    end = README.find("\n## ", start + 1)
    return README[start : end if end >= 0 else None]


def _commands(block: str) -> list[list[str]]:
    """Each command of a ``sh`` block (``&&`` splits one line into several), as argv."""
    out: list[list[str]] = []
    for line in block.splitlines():
        for part in line.split("&&"):
            argv = shlex.split(part, comments=True)
            if argv:
                out.append(argv)
    return out


def _run(argv: list[str], cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    assert argv[0] == "elastic", argv
    return subprocess.run(
        [*ELASTIC, *argv[1:]],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    for name in ("scenarios", "examples"):
        (tmp_path / name).symlink_to(ROOT / name)
    (yaml,) = _blocks("yaml")
    (tmp_path / "example.yaml").write_text(yaml)
    return tmp_path


@pytest.mark.timeout(300)
def test_the_simulator_commands_run_as_printed(workdir: Path) -> None:
    (block,) = _blocks("sh", _section("The simulator"))
    commands = _commands(block)
    assert len(commands) >= 5
    for argv in commands:
        p = _run(argv, workdir)
        assert p.returncode == 0, (argv, p.stdout[-1500:], p.stderr[-1500:])
        assert "Traceback" not in p.stderr, argv
    for made in ("log.jsonl", "explicit.yaml", "timeline.png"):
        assert (workdir / made).stat().st_size > 0, made
    # the written-back scenario replays the same run
    again = _run(["elastic", "sim", "explicit.yaml", "--json"], workdir)
    assert again.returncode == 0, again.stderr


@pytest.mark.timeout(120)
def test_the_example_scenario_succeeds_and_with_min_nodes_4_says_why_it_fails(
    workdir: Path,
) -> None:
    p = _run(["elastic", "sim", "example.yaml"], workdir)
    assert p.returncode == 0 and "expectations met" in p.stdout, p.stdout
    text = (workdir / "example.yaml").read_text()
    assert text.count("min_nodes: 3") == 1
    (workdir / "four.yaml").write_text(text.replace("min_nodes: 3", "min_nodes: 4"))
    p = _run(["elastic", "sim", "four.yaml"], workdir)
    assert p.returncode == 1
    quoted = next(b for b in _blocks("text") if b.startswith("why it ended FAILED:"))
    for line in quoted.splitlines():
        # "…" in the README stands for a part of the line left out
        pattern = ".*".join(re.escape(piece) for piece in line.split("…"))
        assert re.search(pattern, p.stdout), (line, p.stdout)


@pytest.mark.timeout(60)
def test_the_python_snippet_runs_as_printed(tmp_path: Path) -> None:
    (snippet,) = _blocks("python")
    p = subprocess.run(
        [sys.executable, "-c", snippet],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=50,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert p.returncode == 0, p.stderr
    assert p.stdout == "rank 0 of 1\n"


def test_the_test_command_is_what_ci_runs() -> None:
    blocks = _blocks("sh", _section("Set-up (a fresh machine, Python ≥ 3.11)"))
    test_line = next(b.strip() for b in blocks if "pytest" in b)
    assert test_line in (ROOT / ".ci" / "run").read_text()
    # the install commands are what the machine running this suite did to run it; each
    # `elastic` command of the set-up is run (the 512-node one below, marked slow)
    for argv in (a for b in blocks for a in _commands(b)):
        assert argv[0] in ("python", "elastic") or argv == ["bash", "tests/install.sh"], argv
        if argv[0] == "elastic":
            assert argv == ["elastic", "sim", "scenarios/large_gpu_failures_every_3h.yaml"]


def _figure(pattern: str) -> str:
    """A figure of the README's paragraph on the 512-node scenario."""
    text = " ".join(_section("Measurements").split())
    paragraph = text[text.index("The 512-node scenario") :]
    m = re.search(pattern, paragraph[: paragraph.index("tests/test_readme.py")])
    assert m is not None, pattern
    return m.group(1)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_512_node_command_gives_the_figures_the_readme_quotes(workdir: Path) -> None:
    (argv,) = (
        a
        for b in _blocks("sh", _section("Set-up (a fresh machine, Python ≥ 3.11)"))
        for a in _commands(b)
        if a[0] == "elastic"
    )
    p = _run(argv, workdir, timeout=280)
    assert p.returncode == 0, p.stderr
    out = p.stdout
    hours = float(re.search(r"run time .*\((\d+\.\d+) h\)", out).group(1))  # type: ignore[union-attr]
    assert f"{hours:.1f}" == _figure(r"([\d.]+) simulated hours")
    gpu = _figure(r"(\d+) GPU failures")
    assert re.search(rf"faults\s+{gpu} gpu_error\b", out)
    membership = _figure(r"the (\d+) membership restarts")
    assert re.search(rf"membership restarts\s+{membership}\n", out)
    goodput = float(re.search(r"goodput\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]
    assert f"{goodput:.3f}" == _figure(r"goodput ([\d.]+)")
    worst = float(re.search(r"recoveries, max ([\d.]+) s", out).group(1))  # type: ignore[union-attr]
    assert f"{worst:.0f}" == _figure(r"worst recovery (\d+) s")
    sim_events = int(re.search(r"logged, (\d+) simulated", out).group(1))  # type: ignore[union-attr]
    assert str(sim_events // 1000) == _figure(r"(\d+) k simulated events")


@pytest.mark.torch
@pytest.mark.slow
@pytest.mark.timeout(180)
def test_the_real_mode_command_runs_as_printed(workdir: Path, tag: str) -> None:
    pytest.importorskip("torch")
    (block,) = _blocks("sh", _section("Real mode"))
    (argv,) = _commands(block)
    assert argv[:2] == ["elastic", "run"]
    p = subprocess.run(
        [*ELASTIC, *argv[1:]],
        cwd=workdir,
        capture_output=True,
        text=True,
        timeout=170,
        env={**env_for(tag), "PYTHONPATH": str(ROOT)},
    )
    assert p.returncode == 0, p.stderr[-3000:]
