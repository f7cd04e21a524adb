"""Where a decode step of the fixed 8k workload goes (issue 16): GPU time per op class and the kernels of one layer.

Cases (Qwen3-8B shape, random weights, the first `--layers` of its 36 layers; the per-layer numbers are the same
at any depth, and the step at 36 layers is estimated as measured step + (36 - layers) x the layer's kernel sum):
- `w4a4-kv4` (nvfp4 W4A4 + nvfp4 KV, page pool), attention forced to the Gluon kernel, the persistent operand
  cache on, B = 313 (the batch the fixed workload fits with the cache); at the first context measured twice, with the
  rollout's shared input quantization (`models.linear.SHARE_ROLLOUT_INPUTS`, q/k/v and gate/up quantize their
  input once) and without it (before that change: each linear quantizes it), graphs re-captured in between; the
  two forwards' logits are compared bit for bit;
- `bf16` at B = 101 (contiguous cache, auto attention), for comparison.
Contexts 257 and 8447 (the workload's first and last step). Per (case, context): the captured step's median
(CUDA-graph replay, `decode_grid.time_step`), then ONE EAGER step under `torch.profiler`
(`trace_rl.bench.profile.profile_step`): kernel times per op class (every kernel attributed to the op range that
launched it, Triton launches by name; the W4A4 activation quantization inside a linear counts as `quantization`,
the operand-cache path's float32 epilogue as `linear`), graph time - kernel sum = gaps inside the graph, and layer
1's kernels in launch order. Eager launch overhead is not counted (the engine never runs eagerly on a GPU).

Usage: python benchmarks/engine_step_profile.py OUT.json [--layers 8] [--budget-s 95]; `--dry` runs the same code
on the CPU at the tiny preset (no profiler classes, no operand cache, no Gluon; checks the plumbing and the A/B
logits).
"""

from __future__ import annotations

import argparse
import json
import time

import torch

FULL_LAYERS = 36


def cases(dry: bool) -> list[dict]:
    if dry:
        return [dict(plan="w4a4-kv4", batch=3, attention="auto", operand_cache=False, layout="pool", ab=True),
                dict(plan="bf16", batch=2, attention="auto", operand_cache=False, layout="contiguous", ab=False)]
    return [dict(plan="w4a4-kv4", batch=313, attention="gluon", operand_cache=True, layout="pool", ab=True),
            dict(plan="bf16", batch=101, attention="auto", operand_cache=False, layout="contiguous", ab=False)]


def forward_logits(engine, batch: int, length: int) -> torch.Tensor:
    """Eager logits of one decode forward at `length` (the step's K/V write only: no state changes)."""
    from trace_rl.bench.decode_grid import prime_decode

    prime_decode(engine, batch, length)
    path = engine.attention_path(batch, length)
    with torch.no_grad():
        return engine._decode_forward(batch, path, engine.attention_span(path, length)).float().clone()


def dry_step(engine, batch: int, length: int) -> dict:
    """CPU stand-in for `profile_step`: one eager step under the profiler (CPU ops only), its kernel classes."""
    from torch.profiler import ProfilerActivity, profile

    from trace_rl.bench.decode_grid import prime_decode
    from trace_rl.bench.profile import classify

    prime_decode(engine, batch, length)
    path = engine.attention_path(batch, length)
    t0 = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        engine._step(batch, path, (1.0, 0, 1.0), engine.attention_span(path, length))
    per_class, _, count = classify(prof)
    return {"batch": batch, "L": length, "attention_path": path, "eager_step_ms": (time.perf_counter() - t0) * 1e3,
            "kernels": count, "classes_ms": per_class}


def gemm_probe(m: int, hidden: int = 4096, kv: int = 1024, inter: int = 12288, device="cuda", timer=None) -> dict:
    """What the operand-cache linears of one Qwen3-8B layer cost in cuBLAS alone at M = `m` rows (us per layer,
    graph-timed over weight copies > L2): as run now (float32 output for the FP4 epilogue, q/k/v and gate/up as
    separate GEMMs: nvfp4 is not stacked), stacked (one q|k|v and one gate|up GEMM: the operand caches would have
    to be one buffer), and with bf16 output (no float32 round trip; not the FP4 epilogue's rounding)."""
    from trace_rl.engine.timing import graph_median_us

    timer = timer or graph_median_us
    dev = torch.device(device)
    g = torch.Generator(device=dev).manual_seed(0)
    xh = torch.randn(m, hidden, device=dev, generator=g).to(torch.bfloat16)
    xi = torch.randn(m, inter, device=dev, generator=g).to(torch.bfloat16)
    w = lambda n, k, c: [torch.randn(n, k, device=dev, generator=g).to(torch.bfloat16) for _ in range(c)]  # noqa: E731
    qkv, gu = w(hidden + 2 * kv, hidden, 4), w(2 * inter, hidden, 2)
    o, down = w(hidden, hidden, 6), w(hidden, inter, 2)
    f32 = dict(out_dtype=torch.float32)

    def t(groups, x, kw, cut=None):
        calls = []
        for wt in groups:
            parts = [wt] if cut is None else list(torch.split(wt, cut))
            calls += [lambda p=p: torch.mm(x, p.t(), **kw) for p in parts]
        return round(timer(calls) * len(calls) / len(groups), 2)

    qkv_cut, gu_cut = [hidden, kv, kv], [inter, inter]
    res = {"M": m, "us_per_layer": {
        "qkv_fp32_separate": t(qkv, xh, f32, qkv_cut), "qkv_fp32_stacked": t(qkv, xh, f32),
        "qkv_bf16_separate": t(qkv, xh, {}, qkv_cut), "qkv_bf16_stacked": t(qkv, xh, {}),
        "gate_up_fp32_separate": t(gu, xh, f32, gu_cut), "gate_up_fp32_stacked": t(gu, xh, f32),
        "gate_up_bf16_stacked": t(gu, xh, {}),
        "o_fp32": t(o, xh, f32), "o_bf16": t(o, xh, {}), "down_fp32": t(down, xi, f32), "down_bf16": t(down, xi, {})}}
    u = res["us_per_layer"]
    res["now_us"] = u["qkv_fp32_separate"] + u["gate_up_fp32_separate"] + u["o_fp32"] + u["down_fp32"]
    res["stacked_fp32_us"] = u["qkv_fp32_stacked"] + u["gate_up_fp32_stacked"] + u["o_fp32"] + u["down_fp32"]
    res["stacked_bf16_us"] = u["qkv_bf16_stacked"] + u["gate_up_bf16_stacked"] + u["o_bf16"] + u["down_bf16"]
    return res


def run_case(case: dict, args, device, log, sink) -> None:
    from trace_rl.bench import measure as bm
    from trace_rl.bench.profile import profile_step
    from trace_rl.engine.native import NativeEngine
    from trace_rl.models import linear as linear_mod
    from trace_rl.plan import PrecisionPlan

    engine = model = None
    try:
        bm.free()
        plan = PrecisionPlan.preset(case["plan"])
        dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
        model = bm.build_rollout_model(args.model, plan, device, dtype, args.seed, args.layers)
        b = case["batch"]
        engine = NativeEngine(model, plan, max_batch=b, max_seq_len=max(args.lens) + 1, device=device,
                              graph_buckets=[b], kv_layout=case["layout"], attention=case["attention"],
                              operand_cache=case["operand_cache"])
        bm.fill_random(engine.cache, torch.Generator(device=device).manual_seed(args.seed))
        layers = model.config.num_layers
        for length in args.lens:
            logits = {}
            # the A/B at the first context only: the quantization it changes does not depend on the context
            for share in ((True, False) if case["ab"] and length == args.lens[0] else (True,)):
                if time.perf_counter() - args.t0 > args.budget_s:
                    log(f"{case['plan']} L={length} share={share}: skipped (budget)")
                    continue
                linear_mod.SHARE_ROLLOUT_INPUTS = share
                if engine.graphs is not None:
                    engine.graphs.invalidate()     # the captured step follows the switch
                t0 = time.perf_counter()
                res = dry_step(engine, b, length) if args.dry else profile_step(engine, b, length, args.iters)
                if case["ab"]:
                    logits[share] = forward_logits(engine, b, length)
                res.update(plan=case["plan"], attention=case["attention"], operand_cache=case["operand_cache"],
                           layout=case["layout"], layers=layers, share_inputs=share,
                           seconds=round(time.perf_counter() - t0, 1))
                if not args.dry and res.get("layer_kernels"):
                    layer_ms = sum(ms for _, _, ms in res["layer_kernels"])
                    res["layer_kernel_sum_ms"] = round(layer_ms, 4)
                    res["step_ms_at_36_layers_est"] = round(res["graph_step_ms"] + (FULL_LAYERS - layers) * layer_ms, 3)
                sink(res)
                log(f"{case['plan']} B={b} L={length} share={share}: "
                    + (f"graph {res['graph_step_ms']:.2f} ms, kernels {res['kernel_sum_ms']:.2f} ms "
                       f"({res['kernels']}), gaps {res['gaps_ms']:.2f}, est@36 {res.get('step_ms_at_36_layers_est')}"
                       if not args.dry else f"eager {res['eager_step_ms']:.1f} ms")
                    + " | " + " ".join(f"{c}={ms:.3f}" for c, ms in res["classes_ms"].items() if ms))
            if len(logits) == 2:
                same = bool(torch.equal(logits[True].nan_to_num(), logits[False].nan_to_num())
                            and torch.equal(logits[True].isnan(), logits[False].isnan()))
                sink({"plan": case["plan"], "L": length, "shared_vs_separate_logits_identical": same})
                log(f"{case['plan']} L={length}: shared vs separate input quantization logits identical: {same}")
    except Exception as err:   # noqa: BLE001 - one case failing keeps the other's rows
        sink({"plan": case["plan"], "error": f"{type(err).__name__}: {str(err)[:400]}"})
        log(f"{case['plan']} FAILED: {type(err).__name__}: {err}")
    finally:
        from trace_rl.models import linear as linear_mod

        linear_mod.SHARE_ROLLOUT_INPUTS = True
        bm.free(engine, model)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("out")
    p.add_argument("--model", default="qwen3-8b")
    p.add_argument("--layers", type=int, default=8, help="first layers of the model (0: all)")
    p.add_argument("--lens", default="257,8447")
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--budget-s", type=float, default=95.0, help="no new measurement starts after this")
    p.add_argument("--dry", action="store_true", help="CPU, tiny preset: the plumbing and the A/B logits")
    args = p.parse_args()
    args.t0 = time.perf_counter()
    args.lens = [int(x) for x in args.lens.split(",") if x]
    if args.dry:
        args.model, args.layers, args.lens = "tiny", 0, [9, 17]
    device = torch.device("cpu" if args.dry else "cuda")
    rep = {"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu", "model": args.model,
           "layers_run": args.layers, "full_layers": FULL_LAYERS, "lens": args.lens, "rows": []}

    def sink(row):
        rep["rows"].append(row)
        with open(args.out, "w") as f:
            json.dump(rep, f, indent=1)

    def log(msg):
        print(f"[{time.perf_counter() - args.t0:6.1f}s] {msg}", flush=True)

    for case in cases(args.dry):
        run_case(case, args, device, log, sink)
    if not args.dry and time.perf_counter() - args.t0 < args.budget_s + 8:
        try:
            rep["gemm_probe"] = gemm_probe(313)
            log(f"gemm probe M=313 (us per layer): {rep['gemm_probe']}")
        except Exception as err:   # noqa: BLE001
            rep["gemm_probe"] = {"error": f"{type(err).__name__}: {str(err)[:300]}"}
    rep["seconds"] = round(time.perf_counter() - args.t0, 1)
    with open(args.out, "w") as f:
        json.dump(rep, f, indent=1)


if __name__ == "__main__":
    main()
