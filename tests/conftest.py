from __future__ import annotations

import pytest

from tests.worlds import WORLDS


@pytest.fixture(params=WORLDS)
def world(request: pytest.FixtureRequest) -> str:
    return str(request.param)
