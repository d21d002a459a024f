from __future__ import annotations

import os
import shutil
import tempfile

import pytest

from tests.worlds import WORLDS

_TMP_KEY = pytest.StashKey[str]()


def pytest_configure(config: pytest.Config) -> None:
    """One temp directory for the whole session, removed at its end.

    Every temp file or directory the tests and the processes they start make
    (``torchelastic_*`` log dirs, ``elastic_workers_*``, pytest's own) goes under it
    (``TMPDIR`` is inherited), so a test run leaves nothing in the shared temp dir —
    and never touches what other runs on the machine have there.
    """
    tmp = tempfile.mkdtemp(prefix="elastic-tests-")
    config.stash[_TMP_KEY] = tmp
    os.environ["TMPDIR"] = tmp
    tempfile.tempdir = tmp


def pytest_unconfigure(config: pytest.Config) -> None:
    tmp = config.stash.get(_TMP_KEY, None)
    if tmp is not None:
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture(params=WORLDS)
def world(request: pytest.FixtureRequest) -> str:
    return str(request.param)
