"""The rollout bench's workloads: fixed-length responses (per plan, memory filled) and the realistic RL workload
(long-tailed response lengths, stop tokens, GRPO groups). HF `generate` against the native engine: `bench.hf`.

**Fixed** (`fixed_workload`): N prompts x G samples, P prompt tokens, exactly R response tokens. B = the
sequences that fit in memory beside the weights. Decode steps are timed at contexts P+1, P+R/2, P+R-1
(the captured forward alone, `forward_ms`, and the whole step with sampling and bookkeeping, `step_ms`);
a wave = prefill of B rows (timed on G-sample groups, scaled) + (R-1) steps at the Simpson mean;
tokens/s = B*R / wave. An end-to-end `generate` checks the model.

**Realistic** (`realistic_workload`): N prompts x G samples, response lengths drawn from a log-normal
(median `--realistic-median`, sigma `--realistic-sigma`) clipped to [16, R]; each sample ends with a stop
token that the engine detects as in a real run (the bench's head raises the stop token's logit when the
sample reaches its drawn length, and masks it before: random weights never choose to stop). The KV pool
is what the GPU holds beside the weights; with `--realistic-layers` < the model's layers (a cheaper run
of the same shapes), the pool is scaled to hold as many tokens as the whole model's would. Reported: tokens/s (graph
captures excluded and included), preemptions, mean decode batch, prefill tokens, shared prompt pages.
`--realistic-operand-cache` runs a plan with the engine's operand cache, attached before the pool is sized (the pool
is what fits beside it); `--realistic-deadline` probes each built engine and skips a run that would not end in time
(`realistic_guard`; a probed run's captures and counts exclude the probe's).

Both build their engine with the decode attention `--engine-attention` gives the plan (`engine_attention`: forced
where the cache can take it, else auto and the row says why); every row records the paths it ran (`attention_used`).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from trace_rl.bench import measure as bm


def _simpson(values: list[float]) -> float:
    return (values[0] + 4 * values[1] + values[2]) / 6


def random_prompts(batch: int, length: int, vocab: int, device, seed: int):
    from tensordict import TensorDict

    from trace_rl.data import schema as K

    gen = torch.Generator(device=device).manual_seed(seed)
    tokens = torch.randint(4, min(1000, vocab), (batch, length), device=device, generator=gen)
    return TensorDict({K.TOKENS_PROMPT: tokens, K.MASK_PROMPT: torch.ones_like(tokens, dtype=torch.bool)},
                      batch_size=[batch])


def fit_batch(args, model, plan, capacity: int, device, layers_scale: float = 1.0) -> tuple[int, dict]:
    """Sequences of `capacity` tokens that fit beside the weights (capped by N*G and --max-batch)."""
    c = model.config
    per_token = bm.kv_bytes_per_token(plan.kv_cache, c.num_layers, c.num_kv_heads, c.head_dim)
    want = args.prompts * args.group
    if args.max_batch:
        want = min(want, args.max_batch)
    if device.type != "cuda":
        return want, {"kv_bytes_per_token": per_token}
    free, _ = kv_budget(args, model, device, layers_scale)
    per_seq = capacity * per_token + 40 * c.vocab_size          # KV + sampling temporaries over the vocab
    fit = int(free // per_seq)
    return max(1, min(want, fit)), {"kv_bytes_per_token": per_token, "fit": fit, "kv_budget_GB": free / 1e9}


def kv_budget(args, model, device, layers_scale: float = 1.0) -> tuple[float, float]:
    """Bytes free for the KV cache (after --reserve-gb), scaled for a layer-truncated model by
    `layers_scale` = layers run / layers of the full model (its missing layers' weights subtracted first)."""
    from trace_rl.bench.measure import free as free_memory

    free_memory()
    free, total = torch.cuda.mem_get_info(device)
    free += torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)   # cached, reusable
    emulated = sum(4 * lin.quant.out_features * lin.quant.in_features for lin in model.linears().values()
                   if "emulated" in lin.quant.backend.available(device).path and lin.quant.weight_fmt != "bf16")
    free -= args.reserve_gb * 2**30 + emulated
    if layers_scale < 1.0:   # the missing layers' operand caches too, where one is attached (it is in `free`)
        from trace_rl.engine.operand_cache import model_bytes

        per_layer = bm.weight_bytes(model, within="model.layers.0.") + model_bytes(model, within="model.layers.0.")
        missing = per_layer * (len(model.model.layers) / layers_scale - len(model.model.layers))
        free = (free - missing) * layers_scale
    return max(free, 0.0), total


def fixed_workload(args, name: str, plan_name: str, response: int, device, bw, log,
                   attention: str = "auto", operand_cache: bool | str = False) -> dict:
    """`attention`: the engine's decode attention where its cache can take it, else auto (`engine_attention`).
    `operand_cache`: the engine's persistent operand cache (`--operand-cache`: True / 'bf16', or 'fp8'), attached
    before B is fitted to the free memory, so B is what fits beside it (its real bytes: 1 per element for FP8)."""
    from trace_rl.bench.decode_grid import prime_decode, time_step
    from trace_rl.bench.engine_attention import label, resolve, used_paths
    from trace_rl.bench.measure import build_rollout_model, free
    from trace_rl.bench.steps import attention_times
    from trace_rl.engine.base import SamplingParams
    from trace_rl.engine.native import NativeEngine
    from trace_rl.engine.operand_cache import kind_of
    from trace_rl.plan import PrecisionPlan

    free()
    plan = PrecisionPlan.preset(plan_name)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    model = build_rollout_model(name, plan, device, dtype, args.seed, args.layers)
    p, r = args.prompt_len, response
    layout = "contiguous" if plan.kv_cache == "bf16" else "pool"
    block = args.block_size or _page(plan)
    capacity = math.ceil((p + r) / block) * block
    oc_bytes = 0
    if operand_cache:     # before fit_batch: the caches' memory is not the KV pool's
        from trace_rl.engine.operand_cache import attach_model

        oc_bytes = attach_model(model, plan, device, operand_cache)
    batch, fit = fit_batch(args, model, plan, capacity, device)
    engine_attention, attention_fields = resolve(attention, plan, model.config, block, layout, device, dtype, log,
                                                 f"fixed {name} {plan_name} R={r}")
    engine = NativeEngine(model, plan, max_batch=batch, max_seq_len=p + r, block_size=block, device=device,
                          graph_buckets=[batch], prefill_tokens=args.prefill_tokens, kv_layout=layout,
                          attention=engine_attention, operand_cache=operand_cache)
    bm.fill_random(engine.cache, torch.Generator(device=device).manual_seed(args.seed))
    steps = []
    base = None
    if not plan.is_quantized and layout == "contiguous" and args.fixed_baseline:
        from trace_rl.bench.baseline import PlainDecode

        base = PlainDecode.from_rollout_model(engine.model, engine.cache, batch, p + r)
    for length in (p + 1, p + r // 2, p + r - 1):
        prime_decode(engine, batch, length, args.seed)
        fwd = bm.median_ms(lambda n=length: engine.decode_logits(batch, n), device, args.iters)
        step = time_step(engine, batch, length, args.iters)
        steps.append({"L": length, "forward_ms": fwd, "step_ms": step,
                      "path": engine.attention_path(batch, length),
                      "attention_times": attention_times(engine, batch, length)})   # + the Gluon path where it runs
        if base is not None:           # the plain step on the same weights, batch and cache memory
            from trace_rl.bench.decode_grid import best_baseline

            prime_decode(engine, batch, length, args.seed)
            variants, best = best_baseline(args, base, length,
                                           lambda fn: bm.median_ms(fn, device, args.iters), device)
            steps[-1].update(baseline_ms=variants[best]["ms"], baseline_variant=best,
                             baseline_backend=variants[best]["backend"],
                             **{f"baseline_{v}": b for v, b in variants.items()})
    if base is not None:
        baseline = {"compile_s": base.compile_s, "step_ms_mean": _simpson([s["baseline_ms"] for s in steps])}
        baseline["decode_tokens_per_s"] = batch / (baseline["step_ms_mean"] * 1e-3)
        base.release_graphs()
        free(base)
        log(f"fixed {name} R={r} plain PyTorch step (best of {args.baseline_variants}) B={batch}: "
            + " ".join(f"L{s['L']}:{s['baseline_ms']:.2f}ms({s['baseline_variant']})" for s in steps)
            + f" -> {baseline['decode_tokens_per_s']:.0f} decode tok/s; compile {base.compile_s or 0:.1f} s")
    # Prefill: the samples of a prompt share it. Time `timed` rows (whole groups) after a warm-up, scale to B.
    vocab = model.config.vocab_size
    group = min(args.group, batch)
    one = SamplingParams(n=group, temperature=1.0, max_new_tokens=1, ignore_stop=True, seed=args.seed)
    warm = max(1, args.prefill_tokens // p)
    engine.generate(random_prompts(max(1, min(warm, batch) // group), p, vocab, device, args.seed), one)
    timed_prompts = max(1, min(64, batch) // group)
    prefill_s = bm.wall_s(lambda: engine.generate(random_prompts(timed_prompts, p, vocab, device, args.seed + 1),
                                                  one), device) * batch / (timed_prompts * group)
    e2e_prompts, e2e_new = max(1, min(32, batch) // group), min(args.e2e_tokens, r)
    e2e = random_prompts(e2e_prompts, p, vocab, device, args.seed + 2)
    e2e_s = bm.wall_s(lambda: engine.generate(e2e, one.model_copy(update={"max_new_tokens": e2e_new})), device)
    predicted = prefill_s * e2e_prompts * group / batch + (e2e_new - 1) * steps[0]["step_ms"] * 1e-3
    step_mean = _simpson([s["step_ms"] for s in steps])
    fwd_mean = _simpson([s["forward_ms"] for s in steps])
    wave_s = prefill_s + (r - 1) * step_mean * 1e-3
    wbytes = bm.weight_bytes(engine.model)
    per_token = engine.cache.bytes_per_token()
    read_bw = bw.get("read") or 4.0e12
    for s in steps:
        s["bytes"] = wbytes + batch * s["L"] * per_token
        s["floor_ms"] = s["bytes"] / read_bw * 1e3
        s["roofline_frac"] = s["floor_ms"] / s["forward_ms"]
    result = {
        "model": name, "plan": plan_name, "plan_label": plan.label, "layout": layout, "response_len": r,
        "prompt_len": p, "batch": batch, "waves": math.ceil(args.prompts * args.group / batch), **fit,
        "weight_GB": wbytes / 1e9, "operand_cache": bool(operand_cache),
        "operand_cache_kind": kind_of(operand_cache) or None, "operand_cache_GB": oc_bytes / 1e9,
        "kv_bytes_per_token": per_token, "steps": steps,
        "forward_ms_mean": fwd_mean, "step_ms_mean": step_mean, "decode_tokens_per_s": batch / (step_mean * 1e-3),
        "prefill_s": prefill_s, "wave_s": wave_s, "tokens_per_s": batch * r / wave_s,
        "e2e": {"rows": e2e_prompts * group, "new_tokens": e2e_new, "seconds": e2e_s, "predicted_s": predicted,
                "ratio": e2e_s / predicted},
        "paths": engine.report(), **attention_fields,
        "attention_used": used_paths(engine, [s["path"] for s in steps]),
        "plain_baseline": baseline if base is not None else None,
        "peak_memory_GB": torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None,
    }
    st = " ".join(f"L{s['L']}:{s['forward_ms']:.2f}/{s['step_ms']:.2f}ms({s['roofline_frac']:.0%})" for s in steps)
    log(f"fixed {name} R={r} {label(result):<12} {layout:<10} B={batch:<4} tok/s={result['tokens_per_s']:9.0f} {st} "
        f"prefill={prefill_s:.2f}s e2e/pred={result['e2e']['ratio']:.2f} "
        f"attention {','.join(result['attention_used'])}")
    free(engine, model)
    return result


def _page(plan) -> int:
    from trace_rl.kv.cache import default_page_size

    return default_page_size(plan.kv_cache)


class ForcedStop(nn.Module):
    """The realistic workload's head: the model's lm_head, with the stop token's logit set to 1e4 for the
    slots whose sample has reached its drawn length and to -inf before (read from the engine's slot state
    inside the captured step); -inf in the prefill too (its token is the first, and every drawn length is >= 16:
    with a small vocabulary, 512 samples drew the stop token there about once per vocab size / 512)."""

    def __init__(self, head: nn.Module, engine_ref: list, targets: torch.Tensor, stop_id: int):
        super().__init__()
        self.head, self.engine_ref, self.targets, self.stop_id = head, engine_ref, targets, stop_id

    @property
    def quant(self):                     # the wrapped Linear's packed weight (the model checks it is a rollout)
        return self.head.quant

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = self.head(x)
        if x.dim() != 3 or not self.engine_ref:                     # prefill (first token): never the stop
            logits[..., self.stop_id] = float("-inf")
            return logits
        e, n = self.engine_ref[0], x.shape[0]
        due = e.ngen[:n] + 1 >= self.targets[e.slot_row[:n]]
        # the stop token when due, never before (random weights would draw it about once per vocab size)
        logits[:, 0, self.stop_id] = torch.where(due, 1e4, float("-inf")).to(logits.dtype)
        return logits


def draw_lengths(rows: int, median: float, sigma: float, low: int, high: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.exp(math.log(median) + sigma * torch.randn(rows, generator=g))
    return lengths.round().clamp(low, high).long()


def realistic_workload(args, name: str, plan_name: str, device, log, attention: str = "auto",
                       operand_cache: bool | str = False) -> dict:
    """`attention`: the engine's decode attention where its cache can take it, else auto (`engine_attention`).
    `operand_cache` (`--realistic-operand-cache`: True / 'bf16', or 'fp8'): the engine's persistent operand cache,
    attached BEFORE the page pool is sized from free memory (`realistic_pages`), so the pool is what fits beside it.
    With `args.realistic_deadline` (a Unix time), the built engine is probed first (`realistic_guard`) and the run
    skipped when its estimate would end after the deadline: the row is then {"plan", "skipped", "estimate_s", ...}."""
    from trace_rl.bench.engine_attention import label, resolve, used_paths
    from trace_rl.bench.measure import build_rollout_model, free
    from trace_rl.data import schema as K
    from trace_rl.engine.base import SamplingParams
    from trace_rl.engine.native import NativeEngine
    from trace_rl.engine.operand_cache import kind_of
    from trace_rl.models import preset
    from trace_rl.plan import PrecisionPlan

    free()
    plan = PrecisionPlan.preset(plan_name)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    full_layers = preset(name).num_layers
    layers = args.realistic_layers or full_layers
    model = build_rollout_model(name, plan, device, dtype, args.seed, layers)
    c = model.config
    rows, r, p = args.realistic_prompts * args.group, args.realistic_max, args.prompt_len
    block = args.block_size or _page(plan)
    oc_bytes = 0
    if operand_cache:     # before the pool is sized: the caches' memory is not the KV pool's
        from trace_rl.engine.operand_cache import attach_model

        oc_bytes = attach_model(model, plan, device, operand_cache)
    num_pages, per_token = realistic_pages(args, model, plan, device, layers / full_layers, rows, block)
    targets = torch.full((rows + 1,), 1 << 40, dtype=torch.long, device=device)
    lengths = draw_lengths(rows, args.realistic_median, args.realistic_sigma, 16, r, args.seed)
    targets[:rows] = lengths.to(device)
    engine_ref: list = []
    stop_id = 3
    model.lm_head = ForcedStop(model.lm_head, engine_ref, targets, stop_id)
    engine_attention, attention_fields = resolve(attention, plan, c, block, "pool", device, dtype, log,
                                                 f"realistic {name} {plan_name}")
    engine = NativeEngine(model, plan, max_batch=min(rows, args.realistic_max_batch), max_seq_len=p + r,
                          block_size=block, device=device, prefill_tokens=args.prefill_tokens, kv_layout="pool",
                          num_pages=num_pages, attention=engine_attention, operand_cache=operand_cache)
    engine_ref.append(engine)
    prompts = random_prompts(args.realistic_prompts, p, c.vocab_size, device, args.seed + 5)
    sampling = SamplingParams(n=args.group, temperature=1.0, max_new_tokens=r, stop_token_ids=(stop_id,),
                              seed=args.seed)
    head = {"model": name, "plan": plan_name, "layers": layers, "full_layers": full_layers, "rows": rows,
            "prompt_len": p, "max_response": r, "page_size": block, "num_pages": num_pages,
            "kv_pool_GB": num_pages * block * per_token / 1e9, "operand_cache": bool(operand_cache),
            "operand_cache_kind": kind_of(operand_cache) or None, "operand_cache_GB": oc_bytes / 1e9,
            **attention_fields}
    estimate = None
    if getattr(args, "realistic_deadline", 0):
        from trace_rl.bench.realistic_guard import guard

        estimate = guard(engine, prompts, sampling, lengths, args.realistic_deadline, log)
        if estimate.get("skip"):
            free(engine, model)
            return {**head, "skipped": estimate["skip"], "estimate_s": estimate["estimate_s"], "estimate": estimate}
    before = engine.report()         # the probe's captures and counts are not the run's
    holder: dict = {}
    seconds = bm.wall_s(lambda: _generate_into(engine, prompts, sampling, holder), device)
    out = holder["out"]
    rep = engine.report()
    ngen = out[K.NUM_GENERATED]
    tokens = int(ngen.sum())
    setup_s = rep["graph_capture_s"] - before["graph_capture_s"]
    run = {k: rep[k] - before[k] for k in ("preemptions", "decode_rows", "decode_steps", "prefill_tokens",
                                            "shared_prompt_pages")}
    res = {**head, "tokens": tokens, "seconds": seconds,
           "graph_capture_s": setup_s, "tokens_per_s": tokens / max(seconds - setup_s, 1e-9),
           "tokens_per_s_with_capture": tokens / seconds,
           "lengths": {"mean": float(ngen.float().mean()), "median": float(ngen.float().median()),
                       "max": int(ngen.max()), "at_max": int((ngen == r).sum()),
                       "drawn_mean": float(lengths.float().mean()),
                       "honoured": bool(torch.equal(ngen.cpu(), lengths))},
           "preemptions": run["preemptions"], "mean_decode_batch": run["decode_rows"] / max(run["decode_steps"], 1),
           "decode_steps": run["decode_steps"], "prefill_tokens": run["prefill_tokens"],
           "shared_prompt_pages": run["shared_prompt_pages"], "peak_pages": rep["peak_pages"],
           "attention": rep["attention_chosen"], "linear": rep["linear"],
           "operand_cache_kinds": rep["operand_cache_kinds"], "attention_used": used_paths(engine)}
    if estimate is not None:
        res.update(estimate_s=estimate["estimate_s"], estimate=estimate)
    log(f"realistic {name}[{layers}/{full_layers} layers] {label(res):<10} {rows} rows: {tokens} tokens in "
        f"{seconds:.1f}s ({res['tokens_per_s']:.0f} tok/s w/o {setup_s:.1f}s capture), preemptions "
        f"{res['preemptions']}, mean batch {res['mean_decode_batch']:.0f}, pool {res['kv_pool_GB']:.1f} GB"
        + (f", operand cache {res['operand_cache_GB']:.1f} GB" if operand_cache else "")
        + (f", estimated {estimate['estimate_s']:.1f}s" if estimate else "")
        + f", attention {','.join(res['attention_used'])}")
    free(engine, model)
    return res


def realistic_pages(args, model, plan, device, layers_scale: float, rows: int, block: int) -> tuple[int, float]:
    """(pages of the realistic workload's pool, KV bytes per token): on a GPU what the free memory holds beside the
    weights and whatever is already allocated (the operand cache: call this after attaching it), less the sampling
    temporaries of the engine's slots; on a CPU every sample's whole length. At least one longest sequence."""
    c = model.config
    per_token = bm.kv_bytes_per_token(plan.kv_cache, c.num_layers, c.num_kv_heads, c.head_dim)
    p, r = args.prompt_len, args.realistic_max
    if device.type == "cuda":
        budget, _ = kv_budget(args, model, device, layers_scale)
        slots = min(rows, args.realistic_max_batch)
        num_pages = int((budget - slots * 40 * c.vocab_size * layers_scale) // (per_token * block))
    else:
        num_pages = rows * math.ceil((p + r) / block)
    return max(num_pages, math.ceil((p + r) / block)), per_token


def _generate_into(engine, prompts, sampling, holder: dict) -> None:
    holder["out"] = engine.generate(prompts, sampling)
