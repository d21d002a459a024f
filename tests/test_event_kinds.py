"""Event kinds and restart reasons live in one module (``elastic.events.kinds``)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from elastic.events import kinds

ROOT = Path(__file__).resolve().parent.parent
KINDS = ROOT / "elastic" / "events" / "kinds.py"
SOURCES = sorted(p for d in ("elastic", "sim") for p in (ROOT / d).rglob("*.py") if p != KINDS)
EVENT_KINDS = {
    v
    for n in kinds.__all__
    if (v := getattr(kinds, n)).startswith(("agent.", "torchelastic.worker.status."))
    or v in (kinds.RENDEZVOUS, kinds.ASSIGN_WORKER_RANKS)
}


def _string_constants(tree: ast.AST) -> list[tuple[int, str]]:
    """Every string constant in code, docstrings excepted."""
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    return [
        (n.lineno, n.value)
        for n in ast.walk(tree)
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docstrings
    ]


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_no_module_spells_an_event_kind_itself(path: Path) -> None:
    found = [
        f"{path.relative_to(ROOT)}:{line}: {value!r}"
        for line, value in _string_constants(ast.parse(path.read_text()))
        if value in EVENT_KINDS
    ]
    assert found == [], "use elastic.events.kinds instead of the literal:\n" + "\n".join(found)


def test_the_checker_sees_a_literal_kind() -> None:
    tree = ast.parse('"""agent.start"""\nemit("agent.start")\n')
    assert _string_constants(tree) == [(2, "agent.start")]


def test_the_event_log_schema_keeps_its_values() -> None:
    """The values are the public event-log schema: renaming one breaks every reader."""
    assert (kinds.AGENT_START, kinds.AGENT_FINISH, kinds.AGENT_RESTART) == (
        "agent.start",
        "agent.finish",
        "agent.restart",
    )
    assert (kinds.AGENT_GROUP_STARTED, kinds.AGENT_GROUP_STOPPED) == (
        "agent.group_started",
        "agent.group_stopped",
    )
    assert (kinds.AGENT_MEMBERSHIP_CHANGE, kinds.AGENT_UNHEALTHY) == (
        "agent.membership_change",
        "agent.unhealthy",
    )
    assert kinds.WORKER_FAILED == "torchelastic.worker.status.FAILED"
    assert (kinds.RESTART_FAILURE, kinds.RESTART_UNHEALTHY, kinds.RESTART_MEMBERSHIP) == (
        "failure",
        "unhealthy",
        "membership",
    )
    assert (kinds.STOP_RESTARTS_EXHAUSTED, kinds.STOP_RENDEZVOUS_CLOSED) == (
        "restarts_exhausted",
        "rendezvous_closed",
    )
    assert all(
        getattr(kinds, n).startswith(kinds.WORKER_STATUS)
        for n in dir(kinds)
        if n.startswith("WORKER_")
    )
