"""Playbook and inventory: pydantic models, safe YAML with file:line:col errors, target selection, JSON Schema."""

import os

from pydantic.plugin import _loader

# pydantic looks for plugins the first time it builds a validator: it reads the entry points of every installed
# distribution (~10 ms of an apply's start-up). deployer's models take none; PYDANTIC_DISABLE_PLUGINS, when set,
# still decides as pydantic documents it.
if _loader._plugins is None and "PYDANTIC_DISABLE_PLUGINS" not in os.environ:
    _loader._plugins = {}
