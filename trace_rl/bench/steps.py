"""`trace-rl bench rollout --parts steps`: the engine's decode step per plan and decode-attention choice at fixed
(batch, context) cells, e.g. the w4a4-kv4 engine with attention forced to the Triton kernel vs the Gluon kernel
against the bf16 engine (benchmarks/engine_fp4_gluon_h200.sh). Not a default part.

Per model and plan (`--step-plans`): one rollout model (random weights). Per batch B of `--step-grid` and choice
of `--step-attention` ("kernels", "gluon": forced; "auto": the engine's own timed choice): one engine as the fixed
workload builds it (page pool for quantized caches, contiguous for bf16; one graph bucket = B; the cache filled with
random values), and per context L (every row at L):

- `forward_ms`: the captured decode forward alone; `step_ms`: the whole captured step (forward, sampling,
  bookkeeping), as `decode_grid` times them;
- `attention`: ms per layer call of the path the step runs (and, on a GPU, of the Gluon path beside it where the
  cache can take it), each graph-timed over 8 layers' caches as the engine's own choice is (`attention_times`);
- `floor_ms`: (weight bytes + B x L x KV bytes per token) / measured read bandwidth, `roofline_frac` = floor / forward.

A choice the plan's cache or the machine cannot take (`engine_attention.refusal`: gluon with a bf16 cache, or off
sm_90 / Triton 3.6; the Triton kernels on a CPU), or a batch whose cache does not fit beside the weights, is a row
with `skipped` and why: never another path instead.
"""

from __future__ import annotations

import torch

from trace_rl.bench import measure as bm


def attention_times(engine, batch: int, length: int) -> dict:
    """ms per layer call of the engine's candidates at (batch, length), plus the Gluon path where the cache can take
    it (a candidate already unless `GLUON_IN_AUTO` is cleared, or the engine's attention is forced), graph-timed as
    `NativeEngine._time_attention` times its choice. On CPU, or where only one path could run: {} (nothing worth a
    timing). `gluon` says why the Gluon path was left out."""
    from trace_rl.kv.cache import GLUON_PATH

    if engine.device.type != "cuda":
        return {}
    paths = list(dict.fromkeys(engine.attention_candidates(batch, length)))
    why = engine.cache.gluon_refusal()
    if not why and GLUON_PATH not in paths:
        paths.append(GLUON_PATH)
    try:
        record = engine._time_attention(batch, length, paths)
    except RuntimeError as err:            # no path ran: keep the row's step times, say why
        return {"error": f"{type(err).__name__}: {err}", "gluon": why or "timed"}
    record["gluon"] = why or "timed"
    return record


def parse_cells(spec: str) -> dict[int, list[int]]:
    from trace_rl.bench.decode_grid import parse_grid

    return parse_grid(spec)


def run_steps(args, name: str, device, bw, log, sink=None) -> list[dict]:
    """The rows of every (plan, batch, choice, context); each also goes to `sink(row)` as soon as it is measured."""
    from trace_rl.bench import engine_attention
    from trace_rl.bench.decode_grid import prime_decode, time_step
    from trace_rl.bench.measure import build_rollout_model, free
    from trace_rl.bench.workloads import fit_batch
    from trace_rl.engine.native import NativeEngine
    from trace_rl.kv.cache import default_page_size
    from trace_rl.plan import PrecisionPlan

    cells = parse_cells(args.step_grid)
    choices = [c for c in args.step_attention.split(",") if c]
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    read_bw = bw.get("read") or 4.0e12
    rows = []

    def emit(row: dict) -> None:
        rows.append(row)
        if sink is not None:
            sink(row)

    for plan_name in filter(None, args.step_plans.split(",")):
        plan = PrecisionPlan.preset(plan_name)
        free()
        model = build_rollout_model(name, plan, device, dtype, args.seed, args.layers)
        c = model.config
        block = args.block_size or default_page_size(plan.kv_cache)
        layout = "contiguous" if plan.kv_cache == "bf16" else "pool"
        per_token = bm.kv_bytes_per_token(plan.kv_cache, c.num_layers, c.num_kv_heads, c.head_dim)
        wbytes = bm.weight_bytes(model)
        for batch, lengths in cells.items():
            capacity = -(-(max(lengths) + 1) // block) * block
            head = {"model": name, "plan": plan_name, "layout": layout, "batch": batch, "page_size": block}
            if device.type == "cuda":
                fits = fit_batch(args, model, plan, capacity, device)[1]["fit"]   # the fixed workload's sizing
                if fits < batch:
                    for choice in choices:
                        emit({**head, "attention": choice, "skipped": f"{fits} sequences of {capacity} tokens fit "
                                                                     f"beside the weights, not {batch}"})
                    log(f"steps {name} {plan_name} B={batch}: skipped, {fits} sequences fit")
                    continue
            for choice in choices:
                why = engine_attention.refusal(choice, plan, c, block, layout, device, dtype)
                if why:
                    emit({**head, "attention": choice, "skipped": why})
                    log(f"steps {name} {plan_name} B={batch} attention={choice}: skipped ({why})")
                    continue
                engine = None
                try:
                    free()
                    engine = NativeEngine(model, plan, max_batch=batch, max_seq_len=max(lengths) + 1,
                                          block_size=block, device=device, graph_buckets=[batch], kv_layout=layout,
                                          attention=choice)
                    bm.fill_random(engine.cache, torch.Generator(device=device).manual_seed(args.seed))
                    for length in lengths:
                        prime_decode(engine, batch, length, args.seed)
                        fwd = bm.median_ms(lambda e=engine, b=batch, n=length: e.decode_logits(b, n), device,
                                           args.iters)
                        step = time_step(engine, batch, length, args.iters)
                        floor = (wbytes + batch * length * per_token) / read_bw * 1e3
                        row = {**head, "attention": choice, "L": length, "path": engine.attention_path(batch, length),
                               "forward_ms": fwd, "step_ms": step, "floor_ms": floor, "roofline_frac": floor / fwd,
                               "attention_times": attention_times(engine, batch, length),
                               "kv_path": engine.report()["kv"]}
                        emit(row)
                        log(f"steps {name} {plan_name:<9} B={batch:<4} L={length:<5} {choice:<7} forward {fwd:7.2f} "
                            f"ms step {step:7.2f} ms ({row['path']}, {row['roofline_frac']:.0%} of the floor) "
                            f"attention {row['attention_times'].get('ms')}")
                except Exception as err:           # one engine failing must not lose the others
                    emit({**head, "attention": choice, "error": f"{type(err).__name__}: {err}"})
                    log(f"steps {name} {plan_name} B={batch} attention={choice} FAILED: {type(err).__name__}: {err}")
                finally:
                    free(engine)
        free(model)
    return rows


def summary(rows: list[dict]) -> list[dict]:
    """Per (model, B, L): each (plan, attention)'s step and forward ms, and the speedups of the FP4 engine with the
    Gluon kernel over the same engine with the Triton kernel and over the bf16 engine."""
    out = []
    for key in sorted({(r["model"], r["batch"], r["L"]) for r in rows if "step_ms" in r}):
        cell = {f"{r['plan']}/{r['attention']}": r for r in rows if (r["model"], r["batch"], r.get("L")) == key}
        line = {"model": key[0], "batch": key[1], "L": key[2],
                "step_ms": {k: r["step_ms"] for k, r in cell.items()},
                "forward_ms": {k: r["forward_ms"] for k, r in cell.items()}}
        for plan in {r["plan"] for r in cell.values()}:
            gl, kn = cell.get(f"{plan}/gluon"), cell.get(f"{plan}/kernels")
            if gl and kn:
                line[f"{plan}_gluon_vs_kernels_step"] = kn["step_ms"] / gl["step_ms"]
            bf16 = next((r for k, r in cell.items() if k.startswith("bf16/")), None)
            if gl and bf16:
                line[f"{plan}_gluon_vs_bf16_step"] = bf16["step_ms"] / gl["step_ms"]
        out.append({"steps": line})
    return out
