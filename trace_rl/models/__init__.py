"""trace_rl.models."""
