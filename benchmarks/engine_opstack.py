"""Stacked operand cache A/B on the fixed 8k workload's FP4 step (issue 16): q/k/v and gate/up as one GEMM each.

Qwen3-8B shape, random weights, the first `--layers` of its 36 layers, w4a4-kv4 (nvfp4 W4A4 + nvfp4 KV, page pool),
Gluon attention, the operand cache on (its q/k/v and gate/up caches stacked: `engine.operand_cache.STACK`), B = 313.
At contexts 257 and 8447 (KV filled with random values): the CUDA-graph step median (`decode_grid.time_step`,
`--iters` replays) with the stacked GEMMs (`models.linear.STACK_ROLLOUT_OPERANDS` on) and with one GEMM per layer on
the same stacked buffers (off: the per-part operand-cache path, as before this change), graphs re-captured in
between; the two eager forwards' logits compared (max |diff|, relative norm, share identical, argmax agreement:
only cuBLAS's float32 accumulation order differs). The saving per layer (step difference / layers) and x 36 as the
full model's estimate.
Memory: the engine's `operand_cache_bytes` against separate caches (2 bytes x N x K per dense FP4 weight), and the
same for the full Qwen3-8B shape from its plan (no weights built): GB before/after.

Usage: python benchmarks/engine_opstack.py OUT.json [--layers 8] [--budget-s 90]; `--dry`: CPU, tiny preset, no
operand cache (the plumbing only: the fp4 backend emulates on CPU and never stacks).
"""

from __future__ import annotations

import argparse
import json
import time

import torch

FULL_LAYERS = 36


def cache_bytes_for(name: str, plan) -> dict:
    """Operand-cache bytes of preset `name` under `plan` from shapes alone (a meta-device model): separate caches
    (2 bytes per dense FP4 weight element) and stacked (the same + 4 bytes per row of the stacked groups)."""
    from trace_rl.models import preset
    from trace_rl.models.decoder import Decoder

    with torch.device("meta"):
        model = Decoder(preset(name)).apply_plan(plan)
    fp4 = {n: lin for n, lin in model.linears().items() if lin.weight_fmt in ("nvfp4", "mxfp4")}
    separate = sum(2 * lin.out_features * lin.in_features for lin in fp4.values())
    unfusable = [g for g in model.shared_input_groups() if all(p.name in fp4 for p in g)
                 and not type(g[0]).can_fuse(g) and all(p.bias is None for p in g)]
    rf = sum(4 * p.out_features for g in unfusable for p in g)
    return {"separate_gb": round(separate / 1e9, 4), "stacked_gb": round((separate + rf) / 1e9, 4),
            "row_factor_mb": round(rf / 1e6, 3), "stacked_groups": len(unfusable)}


def logits_compare(a: torch.Tensor, b: torch.Tensor) -> dict:
    d = (a - b).abs()
    return {"identical_share": round(float((a == b).float().mean()), 5), "max_abs_diff": float(d.max()),
            "rel_norm": float(d.norm() / b.norm()), "argmax_agree": round(float((a.argmax(-1) == b.argmax(-1))
                                                                                .float().mean()), 5)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("out")
    p.add_argument("--model", default="qwen3-8b")
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--lens", default="257,8447")
    p.add_argument("--batch", type=int, default=313)
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--budget-s", type=float, default=90.0)
    p.add_argument("--dry", action="store_true")
    args = p.parse_args()
    t0 = time.perf_counter()
    lens = [int(x) for x in args.lens.split(",") if x]
    dry = args.dry
    if dry:
        args.model, args.layers, lens, args.batch = "tiny", 0, [9, 17], 3
    device = torch.device("cpu" if dry else "cuda")

    from engine_step_profile import forward_logits

    from trace_rl.bench import measure as bm
    from trace_rl.bench.decode_grid import time_step
    from trace_rl.engine import operand_cache as engine_oc
    from trace_rl.engine.native import NativeEngine
    from trace_rl.models import linear as linear_mod
    from trace_rl.plan import PrecisionPlan

    plan = PrecisionPlan.preset("w4a4-kv4")
    rep = {"device": torch.cuda.get_device_name() if not dry else "cpu", "model": args.model, "layers_run": args.layers,
           "batch": args.batch, "lens": lens, "rows": [], "full_model_cache": cache_bytes_for("qwen3-8b", plan)}

    def save():
        rep["seconds"] = round(time.perf_counter() - t0, 1)
        with open(args.out, "w") as f:
            json.dump(rep, f, indent=1)

    def log(msg):
        print(f"[{time.perf_counter() - t0:6.1f}s] {msg}", flush=True)

    log(f"full qwen3-8b operand cache: {rep['full_model_cache']}")
    engine = model = None
    try:
        dtype = torch.bfloat16 if not dry else torch.float32
        model = bm.build_rollout_model(args.model, plan, device, dtype, 0, args.layers)
        b = args.batch
        engine = NativeEngine(model, plan, max_batch=b, max_seq_len=max(lens) + 1, device=device, graph_buckets=[b],
                              kv_layout="pool", attention="auto" if dry else "gluon", operand_cache=not dry)
        bm.fill_random(engine.cache, torch.Generator(device=device).manual_seed(0))
        dense = engine_oc.fp4_dense(model)
        stacks = engine_oc.stack_groups(model) if not dry else []
        rep["cache"] = {"operand_cache_bytes": engine.report()["operand_cache_bytes"],
                        "separate_bytes": sum(2 * q.out_features * q.in_features for q in dense) if not dry else 0,
                        "row_factor_bytes": sum(4 * q.out_features for g in stacks for q in g),
                        "stacked_groups": len(stacks)}
        log(f"cache: {rep['cache']}")
        layers = model.config.num_layers
        for length in lens:
            logits, steps = {}, {}
            for on in (True, False):
                if time.perf_counter() - t0 > args.budget_s:
                    log(f"L={length} stacked={on}: skipped (budget)")
                    continue
                linear_mod.STACK_ROLLOUT_OPERANDS = on
                if engine.graphs is not None:
                    engine.graphs.invalidate()
                steps[on] = time_step(engine, b, length, args.iters) if not dry else None
                logits[on] = forward_logits(engine, b, length)
                rep["rows"].append({"L": length, "stacked": on, "graph_step_ms": steps[on], "layers": layers})
                log(f"L={length} stacked={on}: step {steps[on]} ms")
                save()
            if len(logits) == 2:
                row = {"L": length, "logits_stacked_vs_per_part": logits_compare(logits[True], logits[False])}
                if steps.get(True) and steps.get(False):
                    row["step_ms_per_part_stacked"] = [round(steps[False], 3), round(steps[True], 3)]
                    row["saved_ms_per_layer"] = round((steps[False] - steps[True]) / layers, 4)
                    row["saved_ms_at_36_layers_est"] = round(row["saved_ms_per_layer"] * FULL_LAYERS, 3)
                rep["rows"].append(row)
                log(f"L={length}: {row}")
                save()
    except Exception as err:   # noqa: BLE001 - keep what was measured, say why the rest is missing
        rep["error"] = f"{type(err).__name__}: {str(err)[:400]}"
        log(f"FAILED: {rep['error']}")
    finally:
        linear_mod.STACK_ROLLOUT_OPERANDS = True
        bm.free(engine, model)
    save()


if __name__ == "__main__":
    main()
