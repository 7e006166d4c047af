import os
from collections.abc import Iterator
from pathlib import Path

import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "long: a test file that runs for a minute or more on 2 busy cores (its tests "
                                       "summed): scheduled first, so that it never ends the suite's run alone")
    # xdist (3.6+) hands out loadfile's files by their count of tests, most first, unless told to keep the
    # collection's order: with it on, the order below was ignored and a long file was seen starting 12 minutes
    # into a 13-minute CI run.
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The files marked long first, each file's tests kept together and in order: xdist (--dist loadfile) hands out
    files in this order, and the suite is CPU-bound, so a long file started last ran on while the other workers
    idled (the last 90 s of a 13-minute run at 55-79% busy)."""
    items.sort(key=lambda item: item.get_closest_marker("long") is None)  # stable: the rest keep their order


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
