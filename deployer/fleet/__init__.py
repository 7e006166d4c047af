"""Many per-host runs driven together: the record, the runner and its rollout strategies, apply, the follow-ups
(rollback, recover, verify), and units restarted as one."""
