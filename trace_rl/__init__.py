"""trace_rl."""
