"""Rollout throughput bench: `python benchmarks/rollout.py --help` (the same as `trace-rl bench rollout`)."""

from trace_rl.bench.rollout import main

if __name__ == "__main__":
    main()
