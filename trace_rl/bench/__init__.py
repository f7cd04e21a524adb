"""Benchmarks run by `trace-rl bench ...`: `rollout` (the native engine per precision plan against the plain
PyTorch decode step, the roofline and HF `generate`), `baseline` (that plain step), `measure` (timers,
bandwidth ceilings, memory sizing, random caches). Above engine/: benches import engines, never the reverse."""
