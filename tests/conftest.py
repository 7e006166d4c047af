import os
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest_plugins = ["fixtures_ssh", "fixtures_netns", "fixtures_repo", "fixtures_services", "fixtures_memory",
                  "fixtures_containers"]


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
