"""The realistic workload's time guard (`--realistic-deadline`): probe a built engine for a few steps, estimate what
its whole run takes, and skip the run (saying why) when it would end after the deadline.

A run of the realistic workload lasts as long as its longest sample, so its time is known from the drawn lengths
and the step's cost. The probe (`probe`, on the engine the run will use, so its graphs and attention choices are
kept) measures:
- the prefill: one `generate` of every prompt for 1 new token, after a warm-up one (`prefill_s`);
- the whole captured decode step (`decode_grid.time_step`, as the fixed workload times it) at the short context
  `p + 16` for the smallest batch the run's tail uses (one GRPO group), 64 rows and the engine's largest batch,
  and at `p + 4096` for 64 rows: the KV read per row and token (`kv_ms_per_row_token`, the step's growth with the
  context);
- each probe point's wall time beyond its timed steps: what a new (batch bucket, context bucket) key of the run costs
  (a CUDA-graph capture, the attention choice's timing; the first point's Triton compiles are left out by the median).

`estimate` then sums over the run's decode steps s = 1 .. longest - 1, with B_s samples still running (all admitted
at once: a run that preempts takes longer, said in `pool_holds_all`):
    step(bucket(B_s)) at the short context (piecewise linear between the probed batches, the smallest batch's time
    below it) + kv_ms_per_row_token x B_s x (p + s - short context)
plus the prefill and one key's cost for each distinct (batch bucket, 512-token context bucket) the run passes.
`guard` skips the run when now + estimate x MARGIN + TEARDOWN_S passes the deadline. The row keeps `estimate_s`
beside its measured `seconds`, so the model can be checked against the GPU (benchmarks/engine_realistic36.py
reports both per run).
"""

from __future__ import annotations

import statistics
import time

import torch

MARGIN = 1.1          # what the probe does not see: the attention timing of keys it did not probe, host jitter
TEARDOWN_S = 5.0      # freeing the engine and writing the row after the run
PROBE_ITERS = 5
PROBE_WARMUP = 3
SHORT = 16            # tokens past the prompt of the short-context probe points
LONG = 4096           # ... of the long-context point (capped by the engine's max_seq_len)
KV_ROWS = 64          # rows of the long-context point (a KV read well above the step's noise)


def probe_points(engine, rows: int, group: int, prompt_len: int) -> tuple[list[int], int, int, int]:
    """([batch buckets probed at the short context], the long point's batch, short context, long context)."""
    from trace_rl.engine.cuda_graphs import bucket_for

    top = engine.max_batch
    small = bucket_for(engine.buckets, min(group, rows, top))
    kv = bucket_for(engine.buckets, min(KV_ROWS, top))
    short = min(max(prompt_len + SHORT, PROBE_WARMUP + PROBE_ITERS + 3), engine.max_seq_len)
    long = min(prompt_len + LONG, engine.max_seq_len)
    return sorted({small, kv, top}), kv, short, long


def probe(engine, prompts, sampling, log=print) -> dict:
    """The probe's measurements (see the module docstring); leaves the engine idle, its graphs kept."""
    from trace_rl.bench import measure as bm
    from trace_rl.bench.decode_grid import time_step
    from trace_rl.data import schema as K

    dev = engine.device
    group = sampling.n
    rows = prompts.batch_size[0] * group
    p = prompts.get(K.TOKENS_PROMPT).shape[1]
    one = sampling.model_copy(update={"max_new_tokens": 1, "stop_token_ids": ()})
    engine.generate(prompts, one)                                   # warm-up: prefill kernels, allocations
    prefill_s = bm.wall_s(lambda: engine.generate(prompts, one), dev)
    batches, kv_rows, short, long = probe_points(engine, rows, group, prompt_len=p)
    step_ms, overhead_s = {}, []
    sampling_key = (float(sampling.temperature), int(sampling.top_k or 0), float(sampling.top_p))

    def point(b: int, length: int) -> float:
        t = time.perf_counter()
        ms = time_step(engine, b, length, PROBE_ITERS, PROBE_WARMUP, sampling_key)
        overhead_s.append(max(time.perf_counter() - t - (PROBE_ITERS + PROBE_WARMUP) * ms * 1e-3, 0.0))
        return ms

    for b in batches:
        step_ms[b] = point(b, short)
    long_ms = point(kv_rows, long) if long > short else step_ms[kv_rows]
    kv = max(long_ms - step_ms[kv_rows], 0.0) / (kv_rows * (long - short)) if long > short else 0.0
    out = {"prefill_s": prefill_s, "short_context": short, "long_context": long, "kv_rows": kv_rows,
           "step_ms": step_ms, "long_step_ms": long_ms, "kv_ms_per_row_token": kv,
           "key_s": statistics.median(overhead_s), "point_overhead_s": overhead_s}
    log(f"realistic probe: prefill {prefill_s:.2f}s, step ms at L={short} "
        + " ".join(f"B{b}:{m:.2f}" for b, m in step_ms.items())
        + f", B{kv_rows}@L{long}: {long_ms:.2f} ms, {out['key_s']:.2f}s per new graph key")
    return out


def _step_at(step_ms: dict, b: int) -> float:
    """The short-context step at bucket b: linear between the probed batches, the nearest one's outside them."""
    pts = sorted((int(k), v) for k, v in step_ms.items())
    if b <= pts[0][0]:
        return pts[0][1]
    for (b0, t0), (b1, t1) in zip(pts, pts[1:]):
        if b <= b1:
            return t0 + (t1 - t0) * (b - b0) / (b1 - b0)
    return pts[-1][1] * b / pts[-1][0]


def live_rows(lengths: torch.Tensor) -> torch.Tensor:
    """B_s: samples still running at decode step s = 1 .. longest - 1 (a sample of length n runs steps 1 .. n-1;
    its first token comes from the prefill)."""
    ordered = torch.sort(lengths.cpu().long()).values
    steps = torch.arange(1, int(ordered[-1]))
    return len(ordered) - torch.searchsorted(ordered, steps, right=True)


def estimate(probed: dict, lengths: torch.Tensor, prompt_len: int, buckets: list[int], context_step: int,
             pool_tokens: int | None = None) -> dict:
    """Seconds the run takes by the probe's step model (module docstring): prefill + decode + new keys."""
    from trace_rl.engine.cuda_graphs import bucket_for

    live = live_rows(lengths)
    steps = torch.arange(1, len(live) + 1)
    per_bucket = {b: _step_at(probed["step_ms"], b) for b in buckets}
    b_steps = [bucket_for(buckets, int(n)) for n in live.tolist()]
    base_ms = sum(per_bucket[b] for b in b_steps)
    ctx = live * (prompt_len + steps - probed["short_context"]).clamp(min=0)
    kv_ms = probed["kv_ms_per_row_token"] * float(ctx.sum())
    ctx_buckets = (-(-(prompt_len + steps) // context_step)).tolist()
    keys = len(set(zip(b_steps, ctx_buckets)))
    keys_s = keys * probed["key_s"]
    total = probed["prefill_s"] + (base_ms + kv_ms) * 1e-3 + keys_s
    peak = int((live * (prompt_len + steps)).max()) if len(live) else 0
    return {"estimate_s": total, "prefill_s": probed["prefill_s"], "decode_base_s": base_ms * 1e-3,
            "decode_kv_s": kv_ms * 1e-3, "new_keys": keys, "new_keys_s": keys_s, "decode_steps": len(live),
            "peak_tokens": peak, "pool_holds_all": None if pool_tokens is None else peak <= pool_tokens}


def decide(estimate_s: float, left_s: float) -> str:
    """'' when a run of `estimate_s` fits in `left_s` (with MARGIN and TEARDOWN_S), else why not."""
    need = estimate_s * MARGIN + TEARDOWN_S
    if need <= left_s:
        return ""
    return (f"estimated {estimate_s:.0f} s (x{MARGIN} + {TEARDOWN_S:.0f} s teardown = {need:.0f} s) does not fit the "
            f"{max(left_s, 0):.0f} s left before the deadline")


def guard(engine, prompts, sampling, lengths: torch.Tensor, deadline: float, log=print, now=time.time) -> dict:
    """Probe `engine`, estimate its run of `lengths`, and decide against `deadline` (a Unix time): the estimate's
    dict, with `skip` = why when the run would not end in time ('' otherwise), `probe` and `probe_s`."""
    from trace_rl.data import schema as K
    from trace_rl.engine.native import CONTEXT_STEP

    t = now()
    probed = probe(engine, prompts, sampling, log)
    p = prompts.get(K.TOKENS_PROMPT).shape[1]
    est = estimate(probed, lengths, p, engine.buckets, CONTEXT_STEP, engine.pool.num_pages * engine.block_size)
    est.update(probe=probed, probe_s=now() - t, left_s=deadline - now())
    est["skip"] = decide(est["estimate_s"], est["left_s"])
    log(f"realistic time guard: estimated {est['estimate_s']:.1f}s (prefill {est['prefill_s']:.1f}, decode "
        f"{est['decode_base_s']:.1f} + KV {est['decode_kv_s']:.1f}, {est['new_keys']} new keys "
        f"{est['new_keys_s']:.1f}), {est['left_s']:.0f}s left: " + (f"SKIPPED ({est['skip']})" if est["skip"]
                                                                      else "runs"))
    return est
