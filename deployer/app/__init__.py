"""The use cases behind the commands, the command line's only way into the core (see DESIGN.md)."""
