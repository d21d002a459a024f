"""A torch process group a worker leaves initialised is destroyed at its normal exit.

Worker rank 0 hosts the workers' TCPStore here (not the agent, as with torchrun); torch's
store server torn down by the interpreter while peers are connected often aborts the
process (SIGABRT) after its work is done.  ``elastic/real/_site/sitecustomize.py``,
first on every worker's ``PYTHONPATH``, destroys the group at exit.  The decisions are
checked with a stand-in ``torch.distributed`` (deterministic, no torch); the real gloo
case is run too when torch is installed.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from elastic.real.workers import SITE_DIR, with_exit_hook
from tests.test_run_cli import elastic_run, script, tag  # noqa: F401  # the fixture

# a stand-in torch.distributed: records whether the group was destroyed at exit
FAKE = """
import os, sys, types
dist = types.ModuleType("torch.distributed")
state = {"up": True}
dist.is_available = lambda: True
dist.is_initialized = lambda: state["up"]
def destroy_process_group():
    state["up"] = False
    open(os.path.join(os.environ["OUT"], "destroyed." + os.environ["LOCAL_RANK"]), "w").close()
dist.destroy_process_group = destroy_process_group
sys.modules["torch.distributed"] = dist
"""


def test_the_site_directory_goes_first_once_and_keeps_the_users_path() -> None:
    assert with_exit_hook({}) == {"PYTHONPATH": SITE_DIR}
    env = with_exit_hook({"PYTHONPATH": "/a" + os.pathsep + "/b"})
    assert env["PYTHONPATH"] == os.pathsep.join([SITE_DIR, "/a", "/b"])
    assert with_exit_hook(dict(env)) == env
    assert set(os.listdir(SITE_DIR)) - {"__pycache__"} == {"sitecustomize.py"}


@pytest.mark.timeout(90)
@pytest.mark.parametrize(
    ("ending", "destroyed", "code"),
    [
        ("pass", True, 0),  # a normal end: destroyed
        ("sys.exit(0)", True, 0),
        ("raise RuntimeError('boom')", False, 1),  # died of an exception: left alone
        ("dist.destroy_process_group(); os.remove(os.path.join(os.environ['OUT'], "
         "'destroyed.' + os.environ['LOCAL_RANK']))", False, 0),  # destroyed by itself
    ],
)  # fmt: skip
def test_a_group_left_initialised_is_destroyed_at_a_normal_exit(
    tmp_path: Path,
    tag: str,  # noqa: F811
    ending: str,
    destroyed: bool,
    code: int,
) -> None:
    # written whole or not at all: a rank stopped by its peer's failure may be mid-write
    seen = (
        "_env = os.path.join(os.environ['OUT'], 'env.' + os.environ['LOCAL_RANK'])\n"
        "open(_env + '.tmp', 'w')"
        ".write(repr((os.environ.get('PYTHONPATH'), [p for p in sys.path if '_site' in p])))\n"
        "os.replace(_env + '.tmp', _env)\n"
    )
    train = script(tmp_path, FAKE + seen + f"import sys\n{ending}\n")
    p = elastic_run(["--nproc-per-node", "2", "--max-restarts", "0", train], tag,
                    OUT=str(tmp_path))  # fmt: skip
    assert p.returncode == code, p.stderr[-2000:]
    # no trace of the hook in what the workers see (torchrun's environment); a rank that
    # raised first gets its peer stopped, perhaps before the peer wrote what it saw
    seen_by = sorted(f for f in tmp_path.glob("env.*") if f.suffix != ".tmp")
    assert seen_by, p.stderr[-2000:]
    for f in seen_by:
        assert f.read_text() == repr((os.environ.get("PYTHONPATH"), [])), f.name
    got = sorted(f.name for f in tmp_path.glob("destroyed.*"))
    assert got == (["destroyed.0", "destroyed.1"] if destroyed else []), p.stderr[-2000:]


@pytest.mark.timeout(90)
def test_off_switch_and_the_shadowed_sitecustomize_still_runs(
    tmp_path: Path,
    tag: str,  # noqa: F811
) -> None:
    user_site = tmp_path / "site"
    user_site.mkdir()
    (user_site / "sitecustomize.py").write_text(
        "import os\nopen(os.path.join(os.environ['OUT'], 'user_site.' + "
        "os.environ['LOCAL_RANK']), 'w').close()\n"
    )
    train = script(
        tmp_path, FAKE + "open(os.environ['OUT'] + '/pp', 'w').write(os.environ['PYTHONPATH'])\n"
    )
    p = elastic_run(["--nproc-per-node", "1", train], tag, OUT=str(tmp_path),
                    PYTHONPATH=str(user_site), ELASTIC_DESTROY_AT_EXIT="0")  # fmt: skip
    assert p.returncode == 0, p.stderr[-2000:]
    assert (tmp_path / "user_site.0").exists()  # the user's sitecustomize ran
    assert (tmp_path / "pp").read_text() == str(user_site)  # the user's PYTHONPATH as given
    assert not list(tmp_path.glob("destroyed.*"))  # switched off


GLOO = """
import torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.ones(1) * (dist.get_rank() + 1)
dist.all_reduce(t)
assert t.item() == 3
# no destroy_process_group(): many training scripts end like this
"""


@pytest.mark.torch
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_gloo_job_that_never_destroys_its_group_ends_cleanly(
    tmp_path: Path,
    tag: str,  # noqa: F811
) -> None:
    pytest.importorskip("torch.distributed")
    train = script(tmp_path, GLOO)
    for _ in range(3):  # without the hook, most runs here ended in SIGABRT
        p = elastic_run(["--nproc-per-node", "2", "--max-restarts", "0", train], tag,
                        timeout=120)  # fmt: skip
        assert p.returncode == 0, p.stderr[-3000:]
