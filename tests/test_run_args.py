"""``elastic run``'s flags and launch config: torchrun 2.13's behaviour, and clear errors."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from elastic.errors import ConfigError
from elastic.run_args import (
    LaunchConfig,
    Std,
    config_from_args,
    get_args_parser,
    parse,
    parse_args,
    parse_min_max_nnodes,
    run_script_path,
)


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name in list(os.environ):
        if name.startswith("PET_") or name in (
            "TORCH_ELASTIC_SHUTDOWN_TIMEOUT",
            "TORCH_ELASTIC_EXIT_BARRIER_TIMEOUT",
            "PYTHON_EXEC",
            "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE",
        ):
            monkeypatch.delenv(name)
    yield


def cfg(argv: list[str], **kw: Any) -> tuple[LaunchConfig, Any, list[str]]:
    kw.setdefault("gpu_count", lambda: 0)
    kw.setdefault("cpu_count", lambda: 8)
    kw.setdefault("environ", {})
    kw.setdefault("new_run_id", lambda: "RID")
    return config_from_args(parse_args(argv), **kw)


def config_error(argv: list[str], **kw: Any) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        cfg(argv, **kw)
    return info.value


# --- compared with torchrun ---------------------------------------------------------

ARGVS: list[list[str]] = [
    ["train.py"],
    ["--nproc-per-node=4", "train.py", "--lr", "0.1", "--nnodes", "7"],
    ["--nproc_per_node", "2", "--nnodes", "1:4", "--rdzv_backend", "c10d", "x.py"],
    [
        "--rdzv-endpoint",
        "h:29400",
        "--rdzv-id",
        "job",
        "--rdzv-conf",
        "read_timeout=1,token=c=d",
        "x.py",
    ],
    ["--standalone", "--max_restarts", "3", "--monitor-interval", "0.5", "x.py"],
    ["--start-method", "fork", "--role", "trainer", "-m", "pkg.mod", "a", "-b"],
    ["--no-python", "--log-dir", "/tmp/l", "-r", "3", "-t", "0:1,1:2", "prog"],
    ["--run-path", "--local-ranks-filter", "0,2", "/abs/s.py"],
    ["--duplicate-stdout-filters", "a,,b,c", "--duplicate_stderr_filters", "", "x.py"],
    [
        "--nnodes",
        "2",
        "--node-rank",
        "1",
        "--master-addr",
        "10.0.0.1",
        "--master_port",
        "1234",
        "x.py",
    ],
    ["--local-addr", "10.1.1.1", "--logs-specs", "mine", "--numa-binding", "socket", "x.py"],
    ["--signals-to-handle", "SIGTERM,SIGUSR1", "--shutdown-timeout", "5", "x.py"],
    ["--virtual-local-rank", "--event-log-handler", "console", "x.py"],
]

PET_CASES: list[dict[str, str]] = [
    {"PET_NPROC_PER_NODE": "3", "PET_NNODES": "2:3", "PET_MAX_RESTARTS": "2"},
    {"PET_STANDALONE": "1", "PET_MODULE": "0", "PET_RDZV_CONF": "join_timeout=5"},
    {"PET_MONITOR_INTERVAL": "2.5", "PET_MASTER_PORT": "4000", "PET_VIRTUAL_LOCAL_RANK": "7"},
    {"PET_DUPLICATE_STDOUT_FILTERS": "x,,y", "PET_SHUTDOWN_TIMEOUT": "9", "PET_TEE": "3"},
]


def _torch_run() -> Any:
    pytest.importorskip("torch")
    import torch.distributed.run as trun

    return trun


def _shared(ours: argparse.Namespace, theirs: argparse.Namespace) -> dict[str, Any]:
    t = vars(theirs)
    o = {k: v for k, v in vars(ours).items() if k in t}
    assert set(t) <= set(vars(ours)), f"flags we lack: {set(t) - set(vars(ours))}"
    return o


@pytest.mark.torch
@pytest.mark.parametrize("argv", ARGVS, ids=[" ".join(a)[:40] for a in ARGVS])
def test_parser_gives_the_same_values_as_torchrun(argv: list[str]) -> None:
    trun = _torch_run()
    theirs = trun.get_args_parser().parse_args(argv)
    ours = parse_args(argv)
    assert _shared(ours, theirs) == vars(theirs)


@pytest.mark.torch
@pytest.mark.parametrize("env", PET_CASES, ids=[",".join(e) for e in PET_CASES])
def test_pet_environment_gives_the_same_values_as_torchrun(
    env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    trun = _torch_run()
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    for argv in (["x.py"], ["--nproc-per-node", "5", "--max-restarts", "1", "x.py"]):
        theirs = trun.get_args_parser().parse_args(argv)
        assert _shared(parse_args(argv), theirs) == vars(theirs)


CONFIG_ARGVS = [
    a
    for a in ARGVS
    if "--standalone" not in a and "--logs-specs" not in a and "--numa-binding" not in a
] + [["--nnodes", "2", "--node-rank", "1", "--nproc-per-node", "3", "x.py"]]


@pytest.mark.torch
@pytest.mark.parametrize("argv", CONFIG_ARGVS, ids=[" ".join(a)[:40] for a in CONFIG_ARGVS])
def test_config_from_args_matches_torchrun(
    argv: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    trun = _torch_run()
    # torch writes OMP_NUM_THREADS into os.environ when unset; keep it set.
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    argv = [a.replace("/tmp/l", str(tmp_path)) for a in argv]
    if "--log-dir" not in argv:
        argv = ["--log-dir", str(tmp_path), *argv]
    targs = trun.get_args_parser().parse_args(argv)
    # what torchrun's run() does before config_from_args
    if (
        targs.rdzv_backend == "static"
        and not targs.rdzv_endpoint
        and targs.master_port is None
        and trun.parse_min_max_nnodes(targs.nnodes)[1] == 1
    ):
        targs.rdzv_backend, targs.rdzv_endpoint, targs.rdzv_id = "c10d", "localhost:0", "RID"
    if targs.master_port is None:
        targs.master_port = 29500
    tconf, tcmd, tcmd_args = trun.config_from_args(targs)
    conf, cmd, cmd_args = config_from_args(
        parse_args(argv), environ=dict(os.environ), new_run_id=lambda: "RID"
    )
    shared = [f.name for f in dataclasses.fields(tconf) if f.name not in ("logs_specs",)]
    for name in shared:
        mine = getattr(conf, name)
        assert mine == getattr(tconf, name), name
    assert conf.redirects == tconf.logs_specs._redirects
    assert conf.tee == tconf.logs_specs._tee
    ranks = tconf.logs_specs._local_ranks_filter
    assert conf.local_ranks_filter == (None if ranks is None else frozenset(ranks))
    assert cmd_args == tcmd_args
    assert cmd == tcmd or (callable(cmd) and cmd.__name__ == tcmd.__name__)


@pytest.mark.torch
def test_launch_config_has_torchs_fields_and_defaults() -> None:
    pytest.importorskip("torch")
    from torch.distributed.launcher.api import LaunchConfig as TorchLaunchConfig

    ours = {f.name: f for f in dataclasses.fields(LaunchConfig)}
    for f in dataclasses.fields(TorchLaunchConfig):
        assert f.name in ours, f.name
        if f.default is not dataclasses.MISSING:
            assert ours[f.name].default == f.default, f.name
    theirs = TorchLaunchConfig(min_nodes=1, max_nodes=2, nproc_per_node=3)
    mine = LaunchConfig(min_nodes=1, max_nodes=2, nproc_per_node=3)
    assert (mine.rdzv_configs, mine.shutdown_timeout) == (
        theirs.rdzv_configs,
        theirs.shutdown_timeout,
    )


# --- torchrun's rules, one by one ----------------------------------------------------


def test_defaults_for_a_bare_script_become_single_node_c10d() -> None:
    c, cmd, cmd_args = cfg(["train.py", "--epochs", "3"])
    assert (c.min_nodes, c.max_nodes, c.nproc_per_node) == (1, 1, 1)
    assert (c.rdzv_backend, c.rdzv_endpoint, c.run_id) == ("c10d", "localhost:0", "RID")
    assert c.max_restarts == 0 and c.monitor_interval == 0.1 and c.role == "default"
    assert c.rdzv_configs == {"timeout": 900}
    assert c.shutdown_timeout == 30
    assert (cmd, cmd_args) == (sys.executable, ["-u", "train.py", "--epochs", "3"])
    assert c.extra_env == {}
    assert (c.redirects, c.tee, c.local_ranks_filter) == (Std.NONE, Std.NONE, None)


def test_standalone_overrides_user_rendezvous_values() -> None:
    c, _, _ = cfg(["--standalone", "--rdzv-backend", "etcd", "--rdzv-id", "mine", "x.py"])
    assert (c.rdzv_backend, c.rdzv_endpoint, c.run_id) == ("c10d", "localhost:0", "RID")


def test_static_stays_static_with_a_master_port_or_several_nodes() -> None:
    c, _, _ = cfg(["--master-port", "1234", "x.py"])
    assert (c.rdzv_backend, c.rdzv_endpoint) == ("static", "127.0.0.1:1234")
    assert c.rdzv_configs == {"rank": 0, "timeout": 900}
    c, _, _ = cfg(["--nnodes", "2", "--node-rank", "1", "x.py"])
    assert (c.rdzv_backend, c.rdzv_endpoint, c.rdzv_configs["rank"]) == (
        "static",
        "127.0.0.1:29500",
        1,
    )


def test_args_namespace_is_not_changed() -> None:
    ns = parse_args(["--standalone", "x.py"])
    before = dict(vars(ns))
    config_from_args(ns, new_run_id=lambda: "R", gpu_count=lambda: 0, environ={})
    assert vars(ns) == before


@pytest.mark.parametrize("bad", ["0", "2:1", "a", "1:2:3", "-1:2", ""])
def test_bad_nnodes_names_the_flag(bad: str) -> None:
    e = config_error([f"--nnodes={bad}", "x.py"])
    assert e.where == "--nnodes" and repr(bad) in e.message and "MIN:MAX" in e.message


def test_negative_max_restarts_is_refused() -> None:
    e = config_error(["--max-restarts", "-1", "x.py"])
    assert str(e) == "--max-restarts: got -1; expected an integer >= 0"


def test_shutdown_timeout_from_flag_env_or_default(monkeypatch: pytest.MonkeyPatch) -> None:
    assert cfg(["--shutdown-timeout", "5", "x.py"])[0].shutdown_timeout == 5
    monkeypatch.setenv("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "12")
    assert cfg(["x.py"])[0].shutdown_timeout == 12
    e = config_error(["--shutdown-timeout", "-3", "x.py"])
    assert str(e) == "--shutdown-timeout: shutdown_timeout must be non-negative, got -3"
    assert "finite" in config_error(["--shutdown-timeout", "inf", "x.py"]).message
    monkeypatch.setenv("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "soon")
    assert config_error(["x.py"]).where == "TORCH_ELASTIC_SHUTDOWN_TIMEOUT"


def test_nproc_per_node_cpu_gpu_auto() -> None:
    assert cfg(["--nproc-per-node", "cpu", "x.py"])[0].nproc_per_node == 8
    assert cfg(["--nproc-per-node", "gpu", "x.py"], gpu_count=lambda: 4)[0].nproc_per_node == 4
    assert cfg(["--nproc-per-node", "auto", "x.py"], gpu_count=lambda: 2)[0].nproc_per_node == 2
    assert cfg(["--nproc-per-node", "auto", "x.py"])[0].nproc_per_node == 8


def test_nproc_per_node_gpu_without_gpus_is_a_clear_error() -> None:
    e = config_error(["--nproc-per-node", "gpu", "x.py"])
    assert e.where == "--nproc-per-node" and "no GPU is visible" in e.message


def test_nproc_per_node_cpu_uses_this_process_affinity() -> None:
    c, _, _ = config_from_args(parse_args(["--nproc-per-node", "cpu", "x.py"]), environ={})
    expected = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    assert c.nproc_per_node == expected


def test_nproc_per_node_gpu_uses_nvml_through_elastic_gpu(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import elastic.gpu

    monkeypatch.setattr(elastic.gpu, "visible_device_count", lambda: 3)
    c, _, _ = config_from_args(parse_args(["--nproc-per-node", "gpu", "x.py"]), environ={})
    assert c.nproc_per_node == 3


@pytest.mark.parametrize("bad", ["0", "-2", "xpu", "many"])
def test_bad_nproc_per_node_is_refused(bad: str) -> None:
    e = config_error([f"--nproc-per-node={bad}", "x.py"])
    assert e.where == "--nproc-per-node" and "expected" in e.message


def test_omp_num_threads_warning_is_torchs_own_banner(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="elastic.run_args")
    cfg(["--nproc-per-node", "2", "x.py"])
    (text,) = [r.getMessage() for r in caplog.records if "OMP_NUM_THREADS" in r.getMessage()]
    stars = "*" * 41
    assert text.split("\n") == [
        "",
        stars,
        "Setting OMP_NUM_THREADS environment variable for each process to be 1 in default, "
        "to avoid your system being overloaded, please further tune the variable for "
        "optimal performance in your application as needed. ",
        stars,
    ]
    caplog.clear()
    cfg(["--nproc-per-node", "2", "x.py"], environ={"OMP_NUM_THREADS": "4"})
    assert not [r for r in caplog.records if "OMP_NUM_THREADS" in r.getMessage()]


def test_omp_num_threads_is_returned_not_set_in_os_environ() -> None:
    before = os.environ.get("OMP_NUM_THREADS")
    c, _, _ = cfg(["--nproc-per-node", "2", "x.py"])
    assert c.extra_env == {"OMP_NUM_THREADS": "1"}
    assert os.environ.get("OMP_NUM_THREADS") == before
    assert (
        cfg(["--nproc-per-node", "2", "x.py"], environ={"OMP_NUM_THREADS": "4"})[0].extra_env == {}
    )
    assert cfg(["x.py"])[0].extra_env == {}


def test_commands_module_no_python_run_path_and_python_exec() -> None:
    assert cfg(["-m", "pkg.train", "a"])[1:] == (sys.executable, ["-u", "-m", "pkg.train", "a"])
    assert cfg(["--no-python", "prog", "-x"])[1:] == ("prog", ["-x"])
    cmd, cmd_args = cfg(["--run-path", "--no-python", "/abs/s.py", "z"])[1:]
    assert cmd is run_script_path and cmd_args == ["/abs/s.py", "z"]
    assert cfg(["x.py"], environ={"PYTHON_EXEC": "/opt/py"})[1] == "/opt/py"


def test_module_with_no_python_is_refused() -> None:
    e = config_error(["-m", "--no-python", "x"])
    assert e.where == "--no-python" and "-m/--module" in e.message


def test_rdzv_conf_is_parsed_with_torchs_rules_and_messages() -> None:
    c, _, _ = cfg(["--rdzv-conf", " join_timeout = 5 , token=a=b ", "x.py"])
    assert c.rdzv_configs == {"join_timeout": "5", "token": "a=b", "timeout": 900}
    e = config_error(["--rdzv-conf", "=3", "x.py"])
    assert e.where == "--rdzv-conf" and "<key1>=<value1>,...,<keyN>=<valueN>" in e.message
    e = config_error(["--rdzv-conf", "a=1,b", "x.py"])
    assert "The rendezvous configuration option 'b' must have a value specified." in e.message


def test_unknown_rdzv_conf_keys_are_refused_in_one_line_naming_them() -> None:
    e = config_error(["--rdzv-conf", "join_timout=5", "x.py"])
    assert e.where == "--rdzv-conf"
    assert "'join_timout'" in e.message and "join_timeout" in e.message
    e = config_error(
        ["--rdzv-backend", "static", "--master-port", "1", "--rdzv-conf", "is_host=1", "x.py"]
    )
    assert "'is_host'" in e.message and "static" in e.message
    e = config_error(
        [
            "--rdzv-backend",
            "c10d",
            "--rdzv-endpoint",
            "h:1",
            "--nnodes",
            "2",
            "--rdzv-conf",
            "store_type=file",
            "x.py",
        ]
    )
    assert "store_type" in e.message and "tcp" in e.message
    c, _, _ = cfg(
        [
            "--rdzv-backend",
            "etcd-v2",
            "--rdzv-endpoint",
            "a:2379,b:2379",
            "--nnodes",
            "2",
            "--rdzv-conf",
            "protocol=https,cacert=/c,key=/k",
            "x.py",
        ]
    )
    assert c.rdzv_configs["protocol"] == "https"


@pytest.mark.parametrize("endpoint", ["h:port", "h:99999", "a b:1", "h:1,"])
def test_malformed_rdzv_endpoint_is_refused_even_for_one_node(endpoint: str) -> None:
    e = config_error(["--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint, "x.py"])
    assert e.where == "--rdzv-endpoint" and repr(endpoint) in e.message


def test_redirects_and_tee_accept_multi_digit_local_ranks() -> None:
    c, _, _ = cfg(["-r", "3", "-t", "0:1,10:2,11:3", "x.py"])
    assert c.redirects == Std.ALL
    assert c.tee == {0: Std.OUT, 10: Std.ERR, 11: Std.ALL}
    assert Std.OUT | Std.ERR == Std.ALL


@pytest.mark.parametrize(("flag", "bad"), [("-r", "4"), ("--tee", "0:1,"), ("-r", "a:1")])
def test_bad_redirects_or_tee_name_the_flag(flag: str, bad: str) -> None:
    e = config_error([flag, bad, "x.py"])
    assert e.where == ("--redirects" if flag == "-r" else "--tee")
    assert repr(bad) in e.message


def test_local_ranks_filter() -> None:
    assert cfg(["--local-ranks-filter", "0,2", "x.py"])[0].local_ranks_filter == {0, 2}
    e = config_error(["--local-ranks-filter", "0,x", "x.py"])
    assert e.where == "--local-ranks-filter" and "0,1,2" in e.message


def test_static_node_rank_must_fit_nnodes() -> None:
    e = config_error(["--nnodes", "2", "--node-rank", "2", "x.py"])
    assert e.where == "--node-rank" and "0..1" in e.message


def test_monitor_interval_and_hang_timeout_must_be_positive() -> None:
    assert config_error(["--monitor-interval", "0", "x.py"]).where == "--monitor-interval"
    assert config_error(["--hang-timeout", "-1", "x.py"]).where == "--hang-timeout"


def test_our_additions_hang_timeout_and_event_log(monkeypatch: pytest.MonkeyPatch) -> None:
    c, _, _ = cfg(["--hang-timeout", "90", "--event-log", "/tmp/ev.jsonl", "x.py"])
    assert (c.hang_timeout, c.event_log) == (90.0, "/tmp/ev.jsonl")
    monkeypatch.setenv("PET_HANG_TIMEOUT", "30")
    assert cfg(["x.py"])[0].hang_timeout == 30.0
    assert cfg(["x.py"])[0].event_log is None


def test_pet_values_fill_absent_flags_and_flags_win(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PET_NPROC_PER_NODE", "4")
    monkeypatch.setenv("PET_STANDALONE", "1")
    assert parse_args(["x.py"]).nproc_per_node == "4"
    assert parse_args(["x.py"]).standalone is True
    assert parse_args(["--nproc_per_node", "2", "x.py"]).nproc_per_node == "2"
    monkeypatch.setenv("PET_STANDALONE", "0")
    assert parse_args(["--standalone", "x.py"]).standalone is True


@pytest.mark.parametrize(
    ("name", "value", "expected"),
    [
        ("PET_MAX_RESTARTS", "many", "an integer"),
        ("PET_MONITOR_INTERVAL", "fast", "a number"),
        ("PET_STANDALONE", "yes", "0 (off) or 1 (on)"),
        ("PET_START_METHOD", "thread", "spawn, fork, forkserver"),
    ],
)
def test_bad_pet_values_name_the_variable(
    monkeypatch: pytest.MonkeyPatch, name: str, value: str, expected: str
) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError) as info:
        parse(["x.py"])
    assert info.value.where == name
    assert repr(value) in info.value.message and expected in info.value.message


def test_bad_pet_value_is_ignored_when_the_flag_is_given(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PET_MAX_RESTARTS", "many")
    assert parse_args(["--max-restarts", "2", "x.py"]).max_restarts == 2


def test_argparse_errors_are_one_line_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        parse_args(["--max-restarts", "lots", "x.py"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith("elastic run: error: --max-restarts: got 'lots'; expected an integer")
    with pytest.raises(SystemExit):
        parse_args([])
    assert "training_script" in capsys.readouterr().err


def test_both_spellings_of_every_long_flag() -> None:
    parser = get_args_parser()
    for action in parser._actions:
        longs = [o for o in action.option_strings if o.startswith("--")]
        for o in longs:
            if "-" in o[2:] or "_" in o[2:]:
                other = "--" + (
                    o[2:].replace("-", "_") if "-" in o[2:] else o[2:].replace("_", "-")
                )
                assert other in parser._option_string_actions, f"{o} lacks {other}"


def test_parse_combines_parsing_and_config() -> None:
    c, cmd, cmd_args = parse(["--nnodes", "1:3", "--rdzv-backend", "c10d", "x.py"])
    assert (c.min_nodes, c.max_nodes, c.rdzv_backend) == (1, 3, "c10d")
    assert cmd == sys.executable and cmd_args == ["-u", "x.py"]


def test_run_script_path_runs_the_script_as_main(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "out.txt"
    script = tmp_path / "s.py"
    script.write_text(
        "import sys\n"
        f"if __name__ == '__main__':\n    with open({str(out)!r}, 'w') as f:\n"
        "        f.write(' '.join(sys.argv[1:]))\n"
    )
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    run_script_path(str(script), "a", "b")
    assert out.read_text() == "a b"


def test_launch_config_copies_rdzv_configs_and_applies_legacy_timeout() -> None:
    given = {"join_timeout": 5}
    c = LaunchConfig(1, 1, 1, rdzv_configs=given, rdzv_timeout=60)
    assert c.rdzv_configs == {"join_timeout": 5, "timeout": 60}
    assert given == {"join_timeout": 5}
    with pytest.raises(ConfigError):
        LaunchConfig(1, 1, 1, shutdown_timeout=-1)


def test_nnodes_errors_are_the_builtin_exceptions_torch_raises() -> None:
    with pytest.raises(RuntimeError):
        parse_min_max_nnodes("2:20:30")
    with pytest.raises(ValueError):
        parse_min_max_nnodes("two")
    with pytest.raises(ConfigError, match="--nnodes"):
        parse_min_max_nnodes("2:20:30")


def test_exit_barrier_timeout_from_flag_pet_env_or_default(monkeypatch: pytest.MonkeyPatch) -> None:
    assert cfg(["x.py"])[0].exit_barrier_timeout == 300.0
    assert cfg(["--exit-barrier-timeout", "30", "x.py"])[0].exit_barrier_timeout == 30.0
    assert cfg(["--exit_barrier_timeout", "0", "x.py"])[0].exit_barrier_timeout == 0.0
    e = config_error(["--exit-barrier-timeout", "-1", "x.py"])
    assert str(e) == "--exit-barrier-timeout: exit_barrier_timeout must be non-negative, got -1"
    monkeypatch.setenv("TORCH_ELASTIC_EXIT_BARRIER_TIMEOUT", "45")
    assert cfg(["x.py"])[0].exit_barrier_timeout == 45.0
    assert cfg(["--exit-barrier-timeout", "5", "x.py"])[0].exit_barrier_timeout == 5.0
    monkeypatch.setenv("PET_EXIT_BARRIER_TIMEOUT", "12")
    assert cfg(["x.py"])[0].exit_barrier_timeout == 12.0
    monkeypatch.setenv("PET_EXIT_BARRIER_TIMEOUT", "soon")
    with pytest.raises(ConfigError) as info:
        parse_args(["x.py"])
    assert info.value.where == "PET_EXIT_BARRIER_TIMEOUT"
