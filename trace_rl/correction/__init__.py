"""trace_rl.correction."""
