"""trace_rl.backends."""
