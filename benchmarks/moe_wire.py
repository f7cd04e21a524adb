"""One MoE layer's experts as the rollout runs them (check `moewire`): Qwen3-30B-A3B shape (128 experts, top-8, hidden
2048, intermediate 768), `GroupedQuantLinear` gate | up stacked (parts=2, the permute's gather handed in as
`src_rows`) then down (SwiGLU handed in as `silu_mul`), as `models.moe._rollout_forward` calls them; router and
un-permute excluded. Per plan (nvfp4 W4A16, mxfp4 W4A16, nvfp4 W4A4) and B routed tokens, the same layer with
`kernels.grouped_dispatch.GLUON_GROUPED` off (every GEMM on the Triton grouped kernel) and on (the dispatch rule
picks per GEMM), each timed twice, interleaved off / on / off / on (CUDA-graph medians, us, one process: every number
beside its baseline); the kernels each setting ran (the backend's `experts.fp4_grouped.gluon` / `.triton` counts of
one eager call); whether the captured layer (on) replays eager's bits; the on-vs-off output difference (the two
kernels sum in different orders) and both against the bf16 `torch._grouped_mm` layer.

    python benchmarks/moe_wire.py --out OUT.json [--batches 128,256,512] [--budget-s 60] [--precompile-only]
                                  [--plans nvfp4_w4a16,mxfp4_w4a16,nvfp4_w4a4]
    python benchmarks/moe_wire.py --smoke          # CPU: interpreter, tiny shapes, wall clock (tests the script)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from functools import partial

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
from kernels_moe_shapes import DEV, MOE, SMOKE, time_us  # noqa: E402

PLANS = (("nvfp4", "bf16"), ("mxfp4", "bf16"), ("nvfp4", "nvfp4"))
SETTINGS = (False, True, False, True)            # GLUON_GROUPED per timing, interleaved


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30)).item()


def layer(gu, dn, x, perm):
    """models.moe._rollout_forward's stacked branch."""
    h = gu(x, perm.ends, src_rows=perm.token_of_row, src_padded=perm.padded)
    return dn(h, perm.ends, silu_mul=True)


def bf16_layer(w_gu, w_d, x, perm):
    import torch.nn.functional as F

    from trace_rl.backends.grouped_linear import grouped_mm
    from trace_rl.models.grouped import gather_rows

    g, u = grouped_mm(gather_rows(x, perm), w_gu, perm.ends).chunk(2, dim=-1)
    return grouped_mm(F.silu(g) * u, w_d, perm.ends)


def plan_name(fmt: str, act: str) -> str:
    return f"{fmt}_{'w4a16' if act == 'bf16' else 'w4a4'}"


def run(batches: list[int], deadline: float, precompile_only: bool, log, plans=PLANS) -> None:
    from trace_rl.backends.grouped_linear import GroupedQuantLinear
    from trace_rl.kernels import grouped_dispatch
    from trace_rl.models.grouped import permute

    E, k, H, I = MOE["experts"], MOE["top_k"], MOE["hidden"], MOE["inter"]
    gen = torch.Generator(device=DEV).manual_seed(1)
    w_gu = torch.randn(E, 2 * I, H, device=DEV, dtype=torch.bfloat16, generator=gen) * 0.02
    w_d = torch.randn(E, H, I, device=DEV, dtype=torch.bfloat16, generator=gen) * 0.02
    inputs = {}
    for B in batches:
        g = torch.Generator(device=DEV).manual_seed(B)
        x = torch.randn(B, H, device=DEV, dtype=torch.bfloat16, generator=g)
        ids = torch.randn(B, E, device=DEV, generator=g).topk(k, dim=1).indices
        perm = permute(ids, E)
        inputs[B] = (x, perm, bf16_layer(w_gu, w_d, x, perm))
    for fmt, act in plans:
        if time.time() > deadline:
            log({"skipped": f"{fmt} {act}: out of time"})
            continue
        gu, dn = GroupedQuantLinear(w_gu, fmt, act, parts=2), GroupedQuantLinear(w_d, fmt, act)
        for m in (gu, dn):
            m.derive_kernel_layout()
            if SMOKE:
                m.force_path = "fp4_grouped"          # CPU tensors: the Triton kernel in the interpreter
        paths = gu.backend.paths
        for B in batches:
            if time.time() > deadline:
                log({"skipped": f"{fmt} {act} B={B}: out of time"})
                continue
            x, perm, ref = inputs[B]
            row = {"plan": plan_name(fmt, act), "B": B, "rows": B * k,
                   "mean_rows_per_expert": B * k / E}
            outs = {}
            try:
                for on in (False, True):
                    grouped_dispatch.GLUON_GROUPED = on
                    before = dict(paths.counts)
                    outs[on] = layer(gu, dn, x, perm)
                    row[f"kernels_{'on' if on else 'off'}"] = {
                        p.rsplit(".", 1)[1]: paths.counts[p] - before.get(p, 0) for p in paths.counts
                        if p.startswith("experts.fp4_grouped.") and paths.counts[p] > before.get(p, 0)}
                row["on_vs_off_rel"] = rel(outs[True], outs[False])
                row["on_vs_off_max_abs"] = (outs[True].float() - outs[False].float()).abs().max().item()
                row["off_vs_bf16_rel"], row["on_vs_bf16_rel"] = rel(outs[False], ref), rel(outs[True], ref)
                if not SMOKE:    # the rollout replays CUDA graphs: the captured layer (on) must give eager's bits
                    grouped_dispatch.GLUON_GROUPED = True
                    graph = torch.cuda.CUDAGraph()
                    torch.cuda.synchronize()
                    with torch.cuda.graph(graph):
                        static = layer(gu, dn, x, perm)
                    graph.replay()
                    torch.cuda.synchronize()
                    row["graph_equals_eager_on"] = bool(torch.equal(static, outs[True]))
                    del graph
                if not precompile_only:
                    us = {"off": [], "on": []}
                    for on in SETTINGS:
                        grouped_dispatch.GLUON_GROUPED = on
                        us["on" if on else "off"].append(round(time_us([partial(layer, gu, dn, x, perm)], reps=10),
                                                               2))
                    row["us_off"], row["us_on"] = us["off"], us["on"]
                    row["speedup"] = round(min(us["off"]) / min(us["on"]), 3)
            except Exception as e:   # noqa: BLE001 -- one (plan, B) failing must not stop the others
                row["error"] = repr(e)[:400]
            finally:
                grouped_dispatch.GLUON_GROUPED = True
            log(row)
        del gu, dn


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--batches", default="128,256,512")
    ap.add_argument("--budget-s", type=float, default=60)
    ap.add_argument("--precompile-only", action="store_true", help="eager calls only (Triton's disk cache), no timing")
    ap.add_argument("--plans", default=",".join(plan_name(*p) for p in PLANS))
    ap.add_argument("--smoke", action="store_true")
    args = ap.parse_args()
    batches = [4, 6] if SMOKE else [int(b) for b in args.batches.split(",")]
    result = {"moe": MOE, "rows": [], "skipped": []}

    def log(row):
        (result["skipped"].append(row["skipped"]) if "skipped" in row else result["rows"].append(row))
        print(json.dumps(row), flush=True)
        if args.out:
            with open(args.out, "w") as f:
                json.dump(result, f, indent=1)

    try:
        if not SMOKE:
            import triton

            result["device"], result["triton"] = torch.cuda.get_device_name(), triton.__version__
        plans = [p for p in PLANS if plan_name(*p) in args.plans.split(",")]
        run(batches, time.time() + args.budget_s, args.precompile_only, log, plans)
    except Exception as e:   # noqa: BLE001 -- saved with what was measured
        import traceback

        result["error"] = traceback.format_exc()[-2000:]
        print(repr(e), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
