"""Many per-host runs driven together: the fleet runner and its record, and units restarted as one."""
