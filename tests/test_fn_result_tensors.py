"""A function worker's torch tensors come back to the agent as tensors (as with torch's
agent), carried as data -- dtype, shape, bytes -- in the JSON result file, never pickled."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from elastic.launcher.api import elastic_launch
from elastic.real import _fn_runner
from elastic.real.workers import _read_result
from tests.test_launcher import _config, tag, tagged

torch = pytest.importorskip("torch")

__all__ = ["tag", "tagged"]


def _round_trip(tmp_path: Path, value: Any) -> tuple[Any, str | None]:
    path = str(tmp_path / "result.json")
    _fn_runner.write_result(path, value)
    return _read_result(path)


@pytest.mark.parametrize(
    "make",
    [
        lambda: torch.rand(3, 4),
        lambda: torch.tensor(7),  # no dimensions
        lambda: torch.zeros(0, 5),  # no elements
        lambda: torch.tensor([True, False, True]),
        lambda: torch.rand(2, 3, dtype=torch.bfloat16),  # numpy has no such dtype
        lambda: torch.tensor([1 + 2j, -3j]),
        lambda: torch.arange(12).reshape(3, 4).t(),  # not contiguous
        lambda: torch.rand(4, requires_grad=True),
    ],
)
def test_a_tensor_comes_back_equal_in_dtype_shape_and_values(tmp_path: Path, make: Any) -> None:
    sent = make()
    got, why = _round_trip(tmp_path, sent)
    assert why is None
    assert isinstance(got, torch.Tensor)
    assert (got.dtype, got.shape) == (sent.dtype, sent.shape)
    assert torch.equal(got, sent.detach())


def test_tensors_inside_containers_and_plain_json_alongside(tmp_path: Path) -> None:
    got, why = _round_trip(tmp_path, {"loss": 0.5, "weights": [torch.ones(2), torch.zeros(1)]})
    assert why is None and got["loss"] == 0.5
    assert torch.equal(got["weights"][0], torch.ones(2))
    assert torch.equal(got["weights"][1], torch.zeros(1))


def test_the_file_holds_data_not_code(tmp_path: Path) -> None:
    path = tmp_path / "result.json"
    _fn_runner.write_result(str(path), torch.tensor([1.0, 2.0]))
    spec = json.loads(path.read_text())["value"][_fn_runner.TENSOR_KEY]
    assert spec["dtype"] == "float32" and spec["shape"] == [2]
    assert set(spec) == {"dtype", "shape", "data"}


@pytest.mark.parametrize(
    "bad",
    [
        {"dtype": "no_such_dtype", "shape": [1], "data": "AAAAAA=="},
        {"dtype": "Tensor", "shape": [1], "data": "AAAAAA=="},  # a torch attribute, not a dtype
        {"dtype": "float32", "shape": [3], "data": "AAAAAA=="},  # 4 bytes for 3 floats
        {"dtype": "float32", "shape": [1], "data": "not base64!"},
        {"dtype": "float32", "data": "AAAAAA=="},
    ],
)
def test_a_malformed_tensor_is_reported_not_raised(tmp_path: Path, bad: dict[str, Any]) -> None:
    path = tmp_path / "result.json"
    path.write_text(json.dumps({"value": {_fn_runner.TENSOR_KEY: bad}}))
    got, why = _read_result(str(path))
    assert got is None and why is not None and "malformed tensor" in why


def test_other_objects_are_still_refused(tmp_path: Path) -> None:
    got, why = _round_trip(tmp_path, object())
    assert got is None and why is not None and "torch tensors" in why


def random_matrix() -> Any:
    return torch.full((10, 10), float(os.environ["RANK"]))


@pytest.mark.timeout(120)
def test_elastic_launch_returns_the_workers_tensors(tmp_path: Path, tagged: str) -> None:
    values = elastic_launch(_config(tmp_path), random_matrix)()
    assert sorted(values) == [0, 1]
    for rank, value in values.items():
        assert isinstance(value, torch.Tensor) and value.shape == (10, 10)
        assert torch.equal(value, torch.full((10, 10), float(rank)))
