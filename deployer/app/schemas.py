"""`deployer schema`: the JSON Schema of a playbook or of an inventory, that an editor validates and completes
them with (the step kinds' params included, each field with its description)."""

from __future__ import annotations

from typing import Any, Literal

from deployer.steps import schema


def schema_for(kind: Literal["playbook", "inventory"]) -> dict[str, Any]:
    return schema.schema_for(kind)
