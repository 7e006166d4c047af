"""A per-host run as an explicit, persisted state machine: its states, its record, and its recovery."""
