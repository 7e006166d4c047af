"""JSON Schemas of the playbook and the inventory, for editors (yaml-language-server) and CI linters."""

from __future__ import annotations

from typing import Any

from deployer.config.models import Inventory, Playbook
from deployer.steps.kinds import KINDS

DIALECT = "https://json-schema.org/draft/2020-12/schema"


def schema_for(kind: str) -> dict[str, Any]:
    if kind == "inventory":
        schema = Inventory.model_json_schema()
        for field in ("start", "stop"):
            # The model also takes a command line as one string (split like a shell would): say so.
            schema["$defs"]["Service"]["properties"][field]["anyOf"].insert(0, {"type": "string"})
        return {"$schema": DIALECT, **schema}
    if kind == "playbook":
        return playbook_schema()
    raise ValueError(f"no schema for {kind!r}")


def playbook_schema() -> dict[str, Any]:
    """The playbook model, with `steps` spelled out: a kind name, or {kind: {its params}}."""
    schema = Playbook.model_json_schema()
    defs: dict[str, Any] = schema.setdefault("$defs", {})
    choices: list[dict[str, Any]] = [{"enum": sorted(KINDS)}]
    for name, cls in sorted(KINDS.items()):
        params = cls.Params.model_json_schema(ref_template="#/$defs/{model}")
        defs.update(params.pop("$defs", {}))
        defs[cls.Params.__name__] = params
        choices.append({"type": "object", "additionalProperties": False, "required": [name],
                        "properties": {name: {"description": summary(cls),
                                              "anyOf": [{"$ref": f"#/$defs/{cls.Params.__name__}"},
                                                        {"type": "null"}]}}})
    schema["properties"]["steps"]["items"] = {"anyOf": choices}
    schema["oneOf"] = [{"required": ["files"]}, {"required": ["patch"]}]
    return {"$schema": DIALECT, **schema}


def summary(cls: type) -> str:
    """The first paragraph of a step kind's docstring, on one line: what an editor shows beside its name."""
    return " ".join((cls.__doc__ or "").strip().split("\n\n")[0].split())
