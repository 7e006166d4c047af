import os
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest_plugins = ["fixtures_ssh", "fixtures_netns", "fixtures_repo", "fixtures_services", "fixtures_memory",
                  "fixtures_containers", "fixtures_kube"]


@pytest.fixture(autouse=True, scope="session")
def own_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Every deployer these tests start keeps its known-good records (transport/early.py) in the session's temp
    dir, not in this user's ~/.cache."""
    cache = tmp_path_factory.mktemp("xdg-cache")
    before = os.environ.get("XDG_CACHE_HOME")
    os.environ["XDG_CACHE_HOME"] = str(cache)
    yield cache
    if before is None:
        del os.environ["XDG_CACHE_HOME"]
    else:
        os.environ["XDG_CACHE_HOME"] = before


@pytest.fixture(autouse=True)
def own_history(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every deployer a test starts without a runs dir of its own keeps its runs in the default one,
    $XDG_STATE_HOME/deployer/runs: that test's own temp dir, never this user's ~/.local/state or another test's."""
    state = tmp_path_factory.mktemp("xdg-state")
    monkeypatch.setenv("XDG_STATE_HOME", str(state))
    return state
