"""torch.distributed.run's Python API at ``elastic.run``: its helpers, ``run(args)``, and
what torch's launcher does around a run (the agent's status event, quoted --rdzv-conf)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any
from unittest import mock

import pytest

import elastic.run as launch
from elastic.launcher.api import LaunchConfig, elastic_launch
from elastic.multiprocessing.errors import ChildFailedError
from elastic.run_args import parse
from tests.test_launcher import tag, tagged

__all__ = ["tag", "tagged"]


def test_torchs_helpers_are_reachable_from_the_run_module() -> None:
    assert launch.parse_min_max_nnodes("2:20") == (2, 20)
    with pytest.raises(RuntimeError):
        launch.parse_min_max_nnodes("2:20:30")
    assert isinstance(launch.get_args_parser(), argparse.ArgumentParser)
    ns = launch.parse_args(["--nproc-per-node", "3", "train.py", "--lr", "1"])
    assert (ns.training_script, ns.training_script_args) == ("train.py", ["--lr", "1"])
    assert callable(launch.config_from_args) and callable(launch.run_script_path)
    assert callable(launch.determine_local_world_size)
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        launch.nope  # noqa: B018


def test_rdzv_endpoint_and_use_env_follow_torchs_rules() -> None:
    static = launch.parse_args(["--rdzv-backend", "static", "--master-addr", "h", "x.py"])
    assert launch.get_rdzv_endpoint(static) == "h:29500"
    given = launch.parse_args(["--rdzv-backend", "c10d", "--rdzv-endpoint", "e:1", "x.py"])
    assert launch.get_rdzv_endpoint(given) == "e:1"
    assert launch.get_use_env(given) is True
    assert launch.get_use_env(argparse.Namespace(use_env=False)) is False


def _touch_script(tmp_path: Path) -> str:
    path = tmp_path / "touch.py"
    path.write_text(
        "import os, sys\nopen(os.path.join(sys.argv[1], os.environ['RANK']), 'w').close()\n"
    )
    return str(path)


@pytest.mark.timeout(120)
def test_run_launches_from_a_parsed_namespace_and_leaves_it_unchanged(
    tmp_path: Path, tagged: str
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    ns = launch.parse_args(["--standalone", "--nproc-per-node", "2", _touch_script(tmp_path)])
    ns.training_script_args = [str(out)]
    before = dict(vars(ns))
    launch.run(ns)
    assert sorted(os.listdir(out)) == ["0", "1"]
    assert vars(ns) == before


@pytest.mark.parametrize("quote", ["'", '"'])
def test_a_quoted_rdzv_conf_is_read_as_its_contents(quote: str) -> None:
    conf = f"{quote}join_timeout=5,last_call_timeout=1{quote}"
    config, _, _ = parse(["--rdzv-backend", "c10d", "--rdzv-conf", conf, "x.py"])
    assert config.rdzv_configs["join_timeout"] == "5"
    assert config.rdzv_configs["last_call_timeout"] == "1"


def test_a_quote_inside_is_still_refused() -> None:
    from elastic.errors import ConfigError

    with pytest.raises(ConfigError, match="--rdzv-conf"):
        parse(["--rdzv-backend", "c10d", "--rdzv-conf", "'join_timeout=5", "x.py"])


def _config(tmp_path: Path) -> LaunchConfig:
    return LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=1,
        run_id="record-test",
        rdzv_backend="c10d",
        rdzv_endpoint="localhost:0",
        max_restarts=0,
        log_dir=str(tmp_path / "logs"),
    )


def ok() -> int:
    return 1


def boom() -> None:
    raise ValueError("no")


@pytest.mark.timeout(120)
def test_each_run_records_the_agents_status_once_even_with_the_null_handler(
    tmp_path: Path, tagged: str
) -> None:
    recorded: list[Any] = []
    with mock.patch("elastic.events.record", side_effect=lambda e, d: recorded.append((e, d))):
        assert elastic_launch(_config(tmp_path), ok)() == {0: 1}
        # a worker's failure is the workers' outcome: the agent itself ran to its end
        with pytest.raises(ChildFailedError):
            elastic_launch(_config(tmp_path), boom)()
    assert [(e.name, e.source.value, d) for e, d in recorded] == [
        ("torchelastic.worker.status.SUCCEEDED", "AGENT", "null"),
        ("torchelastic.worker.status.SUCCEEDED", "AGENT", "null"),
    ]


@pytest.mark.timeout(120)
def test_a_failing_event_handler_raises_after_a_run_as_torchs_does(
    tmp_path: Path, tagged: str
) -> None:
    # torch records the agent's status before it looks at the workers' outcome, and lets
    # the handler's error out (torch's test_launch_elastic_agent_raise_exception)
    with mock.patch("elastic.events.record", side_effect=RuntimeError("handler down")):
        with pytest.raises(RuntimeError, match="handler down"):
            elastic_launch(_config(tmp_path), ok)()
        with pytest.raises(RuntimeError, match="handler down"):
            elastic_launch(_config(tmp_path), boom)()


@pytest.mark.timeout(120)
def test_a_failing_event_handler_does_not_hide_the_agents_own_exception(
    tmp_path: Path, tagged: str
) -> None:
    class AgentDown(Exception):
        pass

    with (
        mock.patch("elastic.events.record", side_effect=RuntimeError("handler down")),
        mock.patch(
            "elastic.agent.server.local_elastic_agent.LocalElasticAgent.run",
            side_effect=AgentDown,
        ),
        pytest.raises(AgentDown),
    ):
        elastic_launch(_config(tmp_path), ok)()
