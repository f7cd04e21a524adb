"""The BF16 engine's decode step against the plain PyTorch step at every (batch, context) of a grid.

Per batch B: one bf16 rollout model (random weights) and one engine (contiguous layout, so that every
decode-attention path can run; one graph bucket = B); the plain step (`baseline.PlainDecode`) runs on the
same weights and over the same cache memory, so a shape that fits one fits the other. Per context L (all
B rows at L, cache filled with random values):

- `engine_ms`: the engine's captured forward with the attention path it chooses for (B, L) (`path`);
  `engine_path_ms`: the forward with each candidate path (`kernels.decode_attention` and its split-count
  variants `kernels.decode_attention:sN` are what the pool layout runs);
- `step_ms`: the whole captured step (forward + fused sampling + bookkeeping);
- `baseline_eager` / `baseline_compiled`: the plain step as written and through `torch.compile`
  (`baseline.VARIANTS`), each with the fastest SDPA backend at (B, L) (all timed); `baseline_ms` = the
  faster of the two (`baseline_variant`, `baseline_backend`): the strongest baseline;
- `ratio` = baseline_ms / engine_ms (>= 1: the engine is faster; `ratio_eager` against the eager step
  alone); the roofline floor = (weight bytes + B * L * KV bytes per token) / measured read bandwidth;
- per batch, `baseline_compile_s`: the compiled variant's first call (compile included; later batches
  reuse the compile unless the batch's shape forces a new one).
"""

from __future__ import annotations

import torch

from trace_rl.bench import measure as bm


def parse_grid(spec: str) -> dict[int, list[int]]:
    """'1:257,4352;100:257' -> {1: [257, 4352], 100: [257]}."""
    grid = {}
    for part in filter(None, spec.split(";")):
        b, lengths = part.split(":")
        grid[int(b)] = [int(x) for x in lengths.split(",") if x]
    if not grid:
        raise ValueError(f"empty decode grid {spec!r}; write it as 'B:L1,L2;B2:L3'")
    return grid


def prime_decode(engine, batch: int, length: int, seed: int = 0) -> None:
    """Put slots [0, batch) mid-generation at context `length` (the next token is fed at position
    length - 1), each on its own contiguous pages, none able to stop: the state a timed step needs. A page pool
    smaller than batch x pages per sequence (the realistic workload's, sized for its mean length: its time guard
    probes there) wraps around: rows then share pages, which a timing does not mind (random values either way)."""
    e, dev = engine, engine.device
    g = torch.Generator(device=dev).manual_seed(seed)
    vocab = min(1000, e.model.config.vocab_size)
    pages = torch.arange(batch * e.pages_per_seq, device=dev, dtype=torch.int32) % e.pool.num_pages
    e.block_table[:batch] = pages.view(batch, -1)
    e.tokens[:batch] = torch.randint(4, vocab, (batch,), device=dev, generator=g)
    e.positions[:batch] = length - 1
    e.live[:batch] = True
    e.ngen[:batch] = 1
    e.limit[:batch] = 1 << 40
    e.slot_row[:batch] = torch.arange(batch, device=dev)
    e.stop_ids.fill_(-1)
    e.rng.copy_(torch.tensor([seed, 0]))


def time_step(engine, batch: int, length: int, iters: int, warmup: int = 3,
              sampling=(1.0, 0, 1.0)) -> float:
    """Median time of the whole captured step whose last timed replay feeds position length - 1."""
    prime_decode(engine, batch, max(1, length - 1 - warmup - iters))
    return bm.median_ms(lambda: engine.decode_step(batch, length, sampling), engine.device, iters, warmup)


def best_baseline(args, base, length: int, timer, device) -> tuple[dict, str]:
    """Each plain-step variant of `--baseline-variants` with its fastest SDPA backend at this context:
    ({variant: sweep result or {"error": ...}}, the fastest variant). Raises if none ran."""
    backends = args.sdpa_backends.split(",") if device.type == "cuda" else ("default",)
    variants = {}
    for variant in args.baseline_variants.split(","):
        try:
            variants[variant] = base.sweep(length, timer, backends, variant)
        except Exception as err:   # one variant failing (e.g. no compiler) keeps the other
            variants[variant] = {"error": f"{type(err).__name__}: {str(err)[:300]}"}
    ran = {v: b for v, b in variants.items() if "ms" in b}
    if not ran:
        raise RuntimeError(f"no plain-step variant ran at B={base.batch}, L={length}: {variants}")
    return variants, min(ran, key=lambda v: ran[v]["ms"])


def run_grid(args, name: str, device, bw, log, sink=None) -> list[dict]:
    """The grid's rows; each also goes to `sink(row)` as soon as it is measured (the bench writes its JSON
    then, so a run cut short keeps the rows it has)."""
    from trace_rl.bench.baseline import PlainDecode
    from trace_rl.bench.measure import build_rollout_model, free
    from trace_rl.engine.native import NativeEngine
    from trace_rl.plan import PrecisionPlan

    plan = PrecisionPlan()
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    model = build_rollout_model(name, plan, device, dtype, args.seed, args.layers)
    read_bw = bw.get("read") or 4.0e12
    rows = []
    for batch, lengths in parse_grid(args.grid).items():
        engine = base = None
        try:
            free()
            engine = NativeEngine(model, plan, max_batch=batch, max_seq_len=max(lengths) + 1, device=device,
                                  graph_buckets=[batch], kv_layout="contiguous")
            bm.fill_random(engine.cache, torch.Generator(device=device).manual_seed(args.seed))
            base = PlainDecode.from_rollout_model(engine.model, engine.cache, batch, max(lengths) + 1)
            wbytes = bm.weight_bytes(engine.model)
            per_token = engine.cache.bytes_per_token()
            for length in lengths:
                prime_decode(engine, batch, length, args.seed)
                timer = lambda fn: bm.median_ms(fn, device, args.iters)  # noqa: E731
                path = engine.attention_path(batch, length)
                candidates = engine.attention_candidates(batch, length)
                per_path, path_errors = {}, {}
                for p in candidates:           # a path that cannot run at this shape is recorded, not fatal
                    try:
                        per_path[p] = timer(lambda p=p, e=engine, b=batch, n=length: e.decode_logits(b, n, path=p))
                    except Exception as err:
                        path_errors[p] = f"{type(err).__name__}: {str(err)[:200]}"
                step = time_step(engine, batch, length, args.iters)
                prime_decode(engine, batch, length, args.seed)
                variants, best_variant = best_baseline(args, base, length, timer, device)
                baseline = variants[best_variant]
                floor = (wbytes + batch * length * per_token) / read_bw * 1e3
                row = {"model": name, "batch": batch, "L": length, "engine_ms": per_path[path], "path": path,
                       "engine_path_ms": per_path, "engine_path_errors": path_errors, "step_ms": step,
                       "baseline_ms": baseline["ms"], "baseline_variant": best_variant,
                       "baseline_backend": baseline["backend"],
                       **{f"baseline_{v}": b for v, b in variants.items()},
                       "baseline_compile_s": base.compile_s, "ratio": baseline["ms"] / per_path[path],
                       "ratio_eager": (variants["eager"]["ms"] / per_path[path]) if "ms" in variants.get(
                           "eager", {}) else None,
                       "floor_ms": floor, "engine_of_floor": floor / per_path[path],
                       "baseline_of_floor": floor / baseline["ms"],
                       "attention_autotune": engine.attention_choice.get((batch, engine.context_bucket(length)))}
                rows.append(row)
                if sink is not None:
                    sink(row)
                each = " ".join(f"{v} {b['ms']:.2f} ({b['backend']})" if "ms" in b else f"{v} FAILED"
                                for v, b in variants.items())
                log(f"grid B={batch:<4} L={length:<5} engine {row['engine_ms']:7.2f} ms ({path}) step "
                    f"{step:7.2f} | plain {each} | ratio {row['ratio']:.3f} vs {best_variant} | floor "
                    f"{floor:6.2f} ms | compile {base.compile_s or 0:.1f} s")
        except Exception as err:           # one batch failing must not lose the others
            rows.append({"model": name, "batch": batch, "error": f"{type(err).__name__}: {err}"})
            if sink is not None:
                sink(rows[-1])
            log(f"grid B={batch} FAILED: {type(err).__name__}: {err}")
        finally:
            if base is not None:
                base.release_graphs()
            free(engine, base)
    free(model)
    return rows

