"""``--logs-specs NAME``: torchrun's plugin group ``torchrun.logs_specs``, end to end.

A plugin is an entry point of a distribution on ``sys.path`` (here a ``.dist-info``
written into a temporary directory put on ``PYTHONPATH``).  One written against
elastic's ``LogsSpecs`` is used as it is; one written for torchrun (a subclass of
torch's) runs through an adapter; a name that is not there is one line and exit 2.
"""

from __future__ import annotations

import subprocess
import textwrap
from pathlib import Path

import pytest

from tests.test_run_cli import ELASTIC_RUN, env_for, tag

__all__ = ["tag"]

pytestmark = pytest.mark.timeout(120)

OURS = """
from elastic.multiprocessing.api import DefaultLogsSpecs, Std

class AllToFiles(DefaultLogsSpecs):
    # every rank's stdout and stderr go to files, whatever the command line says
    def __init__(self, log_dir=None, redirects=Std.NONE, tee=Std.NONE, local_ranks_filter=None):
        super().__init__(log_dir, Std.ALL, Std.NONE, local_ranks_filter)
"""

TORCHS = """
from torch.distributed.elastic.multiprocessing.api import DefaultLogsSpecs, Std

class AllToFiles(DefaultLogsSpecs):
    def __init__(self, log_dir=None, redirects=Std.NONE, tee=Std.NONE, local_ranks_filter=None):
        assert isinstance(tee, Std), tee  # torch's Std, as torchrun would pass
        super().__init__(log_dir, Std.ALL, Std.NONE, local_ranks_filter)
"""

BROKEN = "raise ImportError('the plugin is broken')\n"


def _install(site: Path, module: str, source: str, name: str = "mine") -> None:
    (site / f"{module}.py").write_text(textwrap.dedent(source))
    info = site / f"{module}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {module}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[torchrun.logs_specs]\n{name} = {module}:AllToFiles\n")


def _run(tmp_path: Path, tag: str, name: str) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "hello.py"
    script.write_text("print('hello from the worker', flush=True)\n")
    return subprocess.run(
        [*ELASTIC_RUN, "--standalone", "--nproc-per-node", "1", "--log-dir",
         str(tmp_path / "logs"), "--logs-specs", name, str(script)],
        env=env_for(tag, PYTHONPATH=str(tmp_path / "site")),
        capture_output=True, text=True, timeout=90,
    )  # fmt: skip


def _stdout_logs(tmp_path: Path) -> str:
    return "".join(p.read_text() for p in (tmp_path / "logs").rglob("stdout.log"))


@pytest.mark.parametrize("source", [OURS, TORCHS], ids=["elastic-plugin", "torch-plugin"])
def test_a_logs_specs_plugin_decides_where_the_output_goes(
    tmp_path: Path, tag: str, source: str
) -> None:
    if source is TORCHS:
        pytest.importorskip("torch")
    site = tmp_path / "site"
    site.mkdir()
    _install(site, "allfiles", source)
    r = _run(tmp_path, tag, "mine")
    assert r.returncode == 0, r.stderr
    assert "hello from the worker" in _stdout_logs(tmp_path)
    assert "hello from the worker" not in r.stdout


def test_an_unknown_logs_specs_name_is_one_line_and_exit_2(tmp_path: Path, tag: str) -> None:
    (tmp_path / "site").mkdir()
    r = _run(tmp_path, tag, "nope")
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        "elastic run: error: --logs-specs: Could not find entrypoint under "
        "'torchrun.logs_specs[nope]' key"
    ]


def test_a_plugin_that_does_not_load_is_one_line_and_exit_2(tmp_path: Path, tag: str) -> None:
    site = tmp_path / "site"
    site.mkdir()
    _install(site, "brokenplugin", BROKEN)
    r = _run(tmp_path, tag, "mine")
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "the plugin is broken" in lines[0], r.stderr


def test_default_is_elastics_own_even_beside_torchs_entry_point() -> None:
    from elastic.multiprocessing.api import DefaultLogsSpecs
    from elastic.run import _get_logs_specs_class

    assert _get_logs_specs_class("default") is DefaultLogsSpecs
    assert _get_logs_specs_class(None) is DefaultLogsSpecs
    with pytest.raises(ValueError, match=r"torchrun\.logs_specs\[nope\]"):
        _get_logs_specs_class("nope")
