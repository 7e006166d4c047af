"""Playbook and inventory: pydantic models, safe YAML with file:line:col errors, target selection, JSON Schema.

Importing this package imports nothing (config/paths.py is read before pydantic is, by an early connection)."""
