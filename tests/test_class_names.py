"""No two public classes in the package share a name: a reader who meets ``Cluster`` or
``Store`` in elastic/ or sim/ knows which one it is without looking at the import.

Private classes (a leading underscore) are out of scope: they are not imported across
modules, so their names are read only beside their definition.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# Names that torch's public API forces on two of our classes, each with why.  Empty today:
# torch's ``Event`` (elastic.events.api), ``RendezvousBackend`` (backend_store),
# ``RendezvousSettings`` (dynamic_rendezvous) and ``Store`` (elastic.store) are the only
# classes of those names; the simulator's and the rendezvous model's took other names
# (SimCluster, RendezvousSpec, StoreSpec, RendezvousBackendName, Trigger).
ALLOWED: dict[str, str] = {}


def _public_classes() -> dict[str, list[str]]:
    where: dict[str, list[str]] = defaultdict(list)
    for package in ("elastic", "sim"):
        for path in sorted((ROOT / package).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
            for node in ast.walk(tree):
                if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                    where[node.name].append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return where


def test_no_two_public_classes_share_a_name() -> None:
    duplicates = {
        name: places
        for name, places in _public_classes().items()
        if len(places) > 1 and name not in ALLOWED
    }
    assert duplicates == {}, f"classes defined more than once (rename one): {duplicates}"


def test_the_walk_finds_the_classes_it_must_tell_apart() -> None:
    # the check above proves nothing if the walk misses the packages or nested classes
    found = _public_classes()
    for name in ("SimCluster", "Cluster", "Store", "StoreSpec", "Event", "Trigger", "Scenario"):
        assert len(found[name]) == 1, name
    assert len(found) > 100


def test_each_allowed_duplicate_is_still_a_duplicate() -> None:
    found = _public_classes()
    assert {name for name in ALLOWED if len(found[name]) < 2} == set()
