"""trace_rl.pipelines."""
