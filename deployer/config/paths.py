"""Where a command's inventory is: read before the models are (an early connection keys on its bytes)."""

from __future__ import annotations

import os
from pathlib import Path

from deployer.errors import ConfigError


def find_inventory(explicit: str | None) -> Path:
    chosen = explicit or os.environ.get("DEPLOYER_INVENTORY") or "hosts.yaml"
    path = Path(chosen)
    if not path.exists():
        how = ("-i/--inventory" if explicit else
               "$DEPLOYER_INVENTORY" if os.environ.get("DEPLOYER_INVENTORY") else "./hosts.yaml")
        raise ConfigError(f"inventory {path} not found (from {how}); "
                          "pass -i FILE or set DEPLOYER_INVENTORY")
    return path
