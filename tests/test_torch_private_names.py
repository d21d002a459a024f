"""torch's names that torch's own tests (and some users) reach: where ours keep them."""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from unittest import mock

import pytest

import elastic.events as events
import elastic.rendezvous as rdzv
from elastic.agent.server import api as agent_api
from elastic.launcher.api import fqdn
from elastic.rendezvous import RendezvousParameters
from elastic.rendezvous.static_tcp_rendezvous import StaticTCPRendezvous, create_rdzv_handler
from elastic.utils import get_socket_with_port


def test_agent_api_keeps_torchs_fq_hostname_and_role_instance_info() -> None:
    assert agent_api._get_fq_hostname() == fqdn()
    info = agent_api._RoleInstanceInfo("trainer", 1, 4)
    assert agent_api._RoleInstanceInfo.deserialize(info.serialize()) == info


def test_patching_events_get_logging_handler_at_torchs_path_is_obeyed() -> None:
    with mock.patch("elastic.events.get_logging_handler", return_value=logging.NullHandler()):
        logger = events._get_or_create_logger("elastic_test_destination")
    assert isinstance(logger.handlers[0], logging.NullHandler)
    with (
        mock.patch("elastic.events.get_logging_handler", return_value=logging.StreamHandler()),
        mock.patch("elastic.events.record_rdzv_event") as record,
    ):
        events.construct_and_record_rdzv_event("run", "msg", events.NodeState.RUNNING)
    record.assert_called_once()


def test_static_tcp_rendezvous_module_gives_torchs_handler_twice_alike() -> None:
    sock = get_socket_with_port()
    port = sock.getsockname()[1]
    sock.close()
    params = RendezvousParameters(
        backend="static", endpoint=f"localhost:{port}", run_id="t", min_nodes=1, max_nodes=1, rank=0
    )
    handler = create_rdzv_handler(params)
    assert isinstance(handler, StaticTCPRendezvous) and handler.get_backend() == "static"
    for _ in range(2):
        info = handler.next_rendezvous()
        assert (info.rank, info.world_size) == (0, 1)
    handler.shutdown()
    with pytest.raises(ValueError):
        create_rdzv_handler(
            RendezvousParameters(
                backend="static", endpoint="localhost", run_id="t", min_nodes=1, max_nodes=1, rank=0
            )
        )


def test_out_of_tree_handlers_installed_after_a_first_scan_are_found(tmp_path: Path) -> None:
    rdzv._register_out_of_tree_handlers()
    assert "elastic_late_plugin" not in rdzv.rendezvous_handler_registry._registry
    (tmp_path / "elastic_late_plugin.py").write_text("def make():\n    return 'creator'\n")
    dist = tmp_path / "elastic_late_plugin-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: elastic-late-plugin\nVersion: 0.1\n"
    )
    (dist / "entry_points.txt").write_text(
        "[torchrun.handlers]\nelastic_late_plugin = elastic_late_plugin:make\n"
    )
    sys.path.append(str(tmp_path))
    try:
        rdzv._register_out_of_tree_handlers()
        rdzv._register_out_of_tree_handlers()  # a second scan leaves it alone
        assert rdzv.rendezvous_handler_registry._registry["elastic_late_plugin"] == "creator"
    finally:
        sys.path.remove(str(tmp_path))
        rdzv.rendezvous_handler_registry._registry.pop("elastic_late_plugin", None)
