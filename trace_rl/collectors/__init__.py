"""trace_rl.collectors."""
