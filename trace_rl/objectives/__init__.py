"""trace_rl.objectives."""
