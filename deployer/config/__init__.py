"""Playbook and inventory: pydantic models, safe YAML with file:line:col errors, target selection, JSON Schema."""
