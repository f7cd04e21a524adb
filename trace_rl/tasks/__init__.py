"""trace_rl.tasks."""
