"""FP8 linears on a GPU: accuracy against float64, TE-vs-reference codes, and decode-shape timings.

    python benchmarks/bench_fp8_linear.py --out fp8_linear.json

Paths: bf16 (F.linear), torch `_scaled_mm` rowwise and block (GEMM alone on pre-quantized operands, and
the whole fp8-backend linear with the reference's activation quantization in eager torch), and TE's
te.Linear under the delayed / current / block recipes (forward, no grad, FP8 weight cached). Two times
per path: `eager_us` (launch overhead included, mean of 50 back-to-back calls, best of 5) and `graph_us`
(20 calls captured in one CUDA graph and replayed, as a decode step runs; TE is not captured: None). The
bytes floor is the weight bytes over 4.0 TB/s (DESIGN.md's measured read bandwidth).
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F

from trace_rl.backends import fp8_scaled_mm, te_adapter
from trace_rl.backends.fp8 import FP8Backend, FP8Config
from trace_rl.formats import get_format

READ_BW = 4.0e12
SHAPES = [(4096, 4096), (4096, 12288), (12288, 4096)]   # (K, N): attention-out / MLP-up / MLP-down sized
TOKENS = [1, 16, 64, 256]


def timed(fn, calls: int = 50, repeats: int = 5) -> float:
    """Microseconds per call."""
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        torch.cuda.synchronize()
        best = min(best, start.elapsed_time(end) * 1e3 / calls)
    return best


def timed_graph(fn, calls: int = 20, repeats: int = 5) -> float | None:
    """Microseconds per call replaying a CUDA graph of `calls` calls; None if capture fails."""
    try:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(3):
                fn()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(calls):
                fn()
    except RuntimeError as err:
        print(f"  (graph capture failed: {str(err).splitlines()[0][:120]})")
        return None
    graph.replay()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        best = min(best, start.elapsed_time(end) * 1e3 / calls)
    return best


def rel(y, ref) -> float:
    return ((y.double() - ref).norm() / ref.norm()).item()


def variants(x, w, block_variant):
    """name -> (callable, weight bytes it reads)."""
    n, k = w.shape
    xb, wb = x.bfloat16(), w.bfloat16()
    out = {"bf16": (lambda: F.linear(xb, wb), 2 * n * k)}
    rows = FP8Backend(FP8Config(impl="scaled_mm"))
    pr = rows.prepare_weight(w, "fp8_e4m3:row")
    qa = get_format("fp8_e4m3:row").quantize(xb)
    sa, sb = qa.scales.reshape(-1, 1).float(), pr.q.scales.reshape(1, -1).float().contiguous()
    out["scaled_mm.rowwise.gemm"] = (lambda: torch._scaled_mm(qa.codes, pr.q.codes.t(), scale_a=sa, scale_b=sb,
                                                               out_dtype=torch.bfloat16), n * k)
    out["scaled_mm.rowwise.linear"] = (lambda: rows.linear(xb, pr, "fp8_e4m3:row"), n * k)
    if block_variant:
        blocks = FP8Backend(FP8Config(impl="scaled_mm"))
        pb = blocks.prepare_weight(w, "fp8_e4m3:block")
        qb = get_format("fp8_e4m3:block").quantize(xb)
        swb = fp8_scaled_mm._block_weight_scales(pb, block_variant)
        out["scaled_mm.block.gemm"] = (lambda: fp8_scaled_mm._block_mm(block_variant, qb.codes, qb.scales,
                                                                        pb.q.codes, swb), n * k)
        out["scaled_mm.block.linear"] = (lambda: blocks.linear(xb, pb, "fp8_e4m3:block"), n * k)
    for recipe in te_adapter.probe().supported_recipes():
        if recipe in te_adapter.TE_RECIPES:
            mod = te_adapter.TELinear(wb, recipe=recipe)
            out[f"te.{recipe}"] = (lambda mod=mod: mod(xb), n * k)
    return out


def accuracy(block_variant) -> dict:
    torch.manual_seed(0)
    m, k, n = 64, 4096, 4096
    x = torch.randn(m, k, device="cuda")
    w = torch.randn(n, k, device="cuda") * 0.02
    exact = x.double() @ w.double().T
    res = {}
    with torch.no_grad():
        for name, (fn, _) in variants(x, w, block_variant).items():
            if name.endswith(".gemm"):
                continue
            for _ in range(3):  # delayed scaling needs a history
                y = fn()
            res[name] = {"rel_err_vs_float64": rel(y, exact)}
    for fmt, name in (("row", "scaled_mm.rowwise.linear"), ("block", "scaled_mm.block.linear")):
        if name in res:
            wf = "fp8_e4m3:block128x128" if fmt == "block" else "fp8_e4m3:row"
            ops = (get_format(f"fp8_e4m3:{fmt}").quantize(x.bfloat16().float()).dequantize().double()
                   @ get_format(wf).quantize(w).dequantize().double().T)
            with torch.no_grad():
                res[name]["rel_err_vs_same_operands"] = rel(variants(x, w, block_variant)[name][0](), ops)
    return res


def te_codes() -> dict:
    if "block" not in te_adapter.probe().supported_recipes():
        return {"skipped": te_adapter.probe().why_not("block")}
    torch.manual_seed(1)
    out = {}
    for role, fmt, shape in (("input", "fp8_e4m3:block", (256, 4096)), ("weight", "fp8_e4m3:block128x128",
                                                                        (4096, 4096))):
        x = torch.randn(*shape, device="cuda") * torch.logspace(-3, 3, shape[0], device="cuda")[:, None]
        tq, ref = te_adapter.te_quantize(x, "block", role), get_format(fmt).quantize(x)
        out[role] = {"codes_equal_fraction": (tq.codes.view(torch.uint8) == ref.codes.view(torch.uint8))
                     .float().mean().item(),
                     "dequantized_max_rel_diff": ((tq.dequantized - ref.dequantize()).abs()
                                                  / ref.dequantize().abs().clamp_min(1e-30)).max().item()}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="fp8_linear.json")
    args = ap.parse_args()
    block_variant, block_why = fp8_scaled_mm.block_support(torch.device("cuda"))
    report = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
              "te_probe": te_adapter.probe().as_dict(), "scaled_mm_block": {"variant": block_variant,
                                                                            "why_not": block_why},
              "accuracy_m64_k4096_n4096": accuracy(block_variant), "te_block_codes": te_codes(), "timings_us": []}
    for k, n in SHAPES:
        w = torch.randn(n, k, device="cuda") * 0.02
        for m in TOKENS:
            x = torch.randn(m, k, device="cuda")
            with torch.no_grad():
                for name, (fn, wbytes) in variants(x, w, block_variant).items():
                    us = timed(fn)
                    g = None if name.startswith("te.") else timed_graph(fn)
                    floor = wbytes / READ_BW * 1e6
                    report["timings_us"].append({"path": name, "m": m, "k": k, "n": n, "eager_us": round(us, 2),
                                                 "graph_us": None if g is None else round(g, 2),
                                                 "bytes_floor_us": round(floor, 2)})
                    print(f"{name:26s} m={m:4d} k={k:5d} n={n:5d} eager {us:7.1f} graph "
                          f"{'-' if g is None else f'{g:6.1f}':>6s} us (floor {floor:5.1f})", flush=True)
    print(json.dumps({k: v for k, v in report.items() if k != "timings_us"}, indent=1))
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
