"""trace_rl.kernels."""
