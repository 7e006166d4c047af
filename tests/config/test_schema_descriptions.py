"""`deployer schema`: every key of a playbook and of an inventory says what it is, for an editor to show on hover."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from fixtures_repo import deployer


def undescribed(node: Any, at: str = "#") -> list[str]:
    """Where, under node, a property has no description, or one of more than one line."""
    found = []
    if isinstance(node, dict):
        for key, prop in (node.get("properties") or {}).items():
            said = prop.get("description", "")
            if not said.strip() or "\n" in said:
                found.append(f"{at}/properties/{key}")
        for key, value in node.items():
            found += undescribed(value, f"{at}/{key}")
    elif isinstance(node, list):
        for index, value in enumerate(node):
            found += undescribed(value, f"{at}/{index}")
    return found


def printed_schema(kind: str, cwd: Path) -> dict[str, Any]:
    result = deployer("schema", kind, cwd=cwd)
    assert result.returncode == 0, result.stderr
    schema: dict[str, Any] = json.loads(result.stdout)
    return schema


@pytest.mark.parametrize("kind", ["playbook", "inventory"])
def test_every_property_of_the_printed_schema_has_a_one_line_description(kind: str, tmp_path: Path) -> None:
    schema = printed_schema(kind, tmp_path)
    assert schema["properties"], schema
    assert undescribed(schema) == []


def test_the_descriptions_are_the_models_own_down_to_each_step_kind_and_its_parameters(tmp_path: Path) -> None:
    playbook, inventory = printed_schema("playbook", tmp_path), printed_schema("inventory", tmp_path)
    kinds = {name: choice["properties"][name] for choice in playbook["properties"]["steps"]["items"]["anyOf"][1:]
             for name in choice["properties"]}
    assert kinds["drain"]["description"].startswith("The symptom must be gone")
    assert playbook["$defs"]["DrainParams"]["properties"]["within_s"]["description"]
    assert inventory["$defs"]["SshHost"]["properties"]["host_key_policy"]["description"].startswith("reject")
    assert "masked" in inventory["$defs"]["SecretValue"]["properties"]["secret"]["description"]
