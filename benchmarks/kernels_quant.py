"""The `quant` section of benchmarks/kernels.py (`--sections quant`; benchmarks/weight_sync_h200.sh runs it): activation
quantization per token, and the weight re-quantization of a Qwen3-8B-shaped model (252 linears: quantize + the
Hopper layout) captured in one CUDA graph: the default kernels, the engine's sync as it runs, and with
`--fast-quantize` `quantize(..., fast=True)` and the fused `quantize_relayout`, each checked bit-exact against the
default path before it is timed. Timing as kernels.py (`kernel_baselines.graph_us`)."""

from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from kernel_baselines import graph_us  # noqa: E402

DEV = "cuda"
QWEN3_8B_LINEARS = [(4096, 4096), (1024, 4096), (1024, 4096), (4096, 4096), (12288, 4096), (12288, 4096),
                    (4096, 12288)]   # (N, K) of q, k, v, o, gate, up, down; 36 layers


def _same_bits(codes, scales, global_scale, h, q, lay) -> bool:
    """Quantized weight buffers (`codes`, `scales`, `global_scale`) and Hopper layout `h` bit for bit equal to the
    default path's QTensor `q` and layout `lay` (scales and row factors compared as integers: NaN-safe)."""
    return (torch.equal(codes, q.codes) and torch.equal(scales.view(torch.uint8), q.scales.view(torch.uint8))
            and (q.global_scale is None or torch.equal(global_scale, q.global_scale))
            and torch.equal(h.values, lay.values) and torch.equal(h.scales, lay.scales)
            and torch.equal(h.row_factor.view(torch.int32), lay.row_factor.view(torch.int32)))


def _bench_fused(fmt: str, weights: list, qs: list, lays: list, res: dict) -> None:
    """`quantize_relayout` (quantize with the Hopper re-layout fused into its store) over the 252 weights: first
    checked bit for bit against the default path's QTensors `qs` and layouts `lays` (`quantize(w, fmt,
    fast=False)`, `relayout`) on every weight (codes, scales, global scale, layout words, scales, row factors),
    then timed into those buffers in place, one CUDA graph. (The amax pass alone: `_bench_engine_sync`.)"""
    from trace_rl.kernels.quantize_relayout import quantize_relayout

    key = f"requant_8b_{fmt}_fused"
    try:
        same, bad = True, []
        for i, (w, q, lay) in enumerate(zip(weights, qs, lays)):
            fq, fh = quantize_relayout(w, fmt)
            ok = _same_bits(fq.codes, fq.scales, fq.global_scale, fh, q, lay)
            if not ok and len(bad) < 4:
                bad.append([i, *w.shape])
            same &= ok
            del fq, fh
        res[f"{key}_bit_exact_vs_default"] = same
        if bad:
            res[f"{key}_mismatch_weights"] = bad
        res[f"{key}_graph_ms"] = graph_us(
            [lambda: [quantize_relayout(w, fmt, out=lay, q=q) for w, lay, q in zip(weights, lays, qs)]],
            reps=3) / 1e3
    except Exception as e:   # noqa: BLE001
        res[f"{key}_error"] = repr(e)[:300]


def _sync_bad(layers: list, hs: list, qs: list, lays: list) -> list:
    """Indices of the linears whose buffers and layout differ from the default path's `qs` / `lays`."""
    return [i for i, (layer, h, q, lay) in enumerate(zip(layers, hs, qs, lays))
            if not _same_bits(layer.w_codes, layer.w_scales, layer.w_global_scale, h, q, lay)]


def _garbage(layers: list, hs: list) -> None:
    for layer, h in zip(layers, hs):     # stale contents: the sync must overwrite all of them
        for t in (layer.w_codes, layer.w_scales.view(torch.uint8), h.values, h.scales):
            t.fill_(0x5A)
        h.row_factor.fill_(7.0)
        if layer.w_global_scale is not None:
            layer.w_global_scale.fill_(3.0)


def _bench_engine_sync(fmt: str, weights: list, qs: list, lays: list, res: dict) -> None:
    """The engine's weight sync as it runs (`NativeEngine.load_weights` -> `QuantLinear.load_weight` for each of the
    252 linears, layouts derived: the layers ran), one CUDA graph. First the buffers and layouts are filled with
    garbage and synced once eagerly: every linear must take `fp4.sync.fused` and end bit for bit on the default
    path's QTensors `qs` and layouts `lays` (quantize(fast=False), relayout). nvfp4: also as `load_weights` batches
    it (`load_linear_weights` over ~1 GiB of weights, NativeEngine.SYNC_BATCH_BYTES: the tensor amaxes of a batch in
    one launch), and the amax pass alone per weight / per batch / in one launch."""
    from trace_rl.backends import QuantLinear, get_backend
    from trace_rl.backends.quant_linear import load_linear_weights
    from trace_rl.kernels.linear import hopper_weight

    key = f"sync_8b_{fmt}_engine"
    try:
        layers = [QuantLinear(w, fmt) for w in weights]
        hs = [hopper_weight(layer.packed) for layer in layers]
        _garbage(layers, hs)
        counts = get_backend("fp4").paths.counts
        before = counts["fp4.sync.fused"]
        for layer, w in zip(layers, weights):
            layer.load_weight(w)
        res[f"{key}_fused_linears"] = counts["fp4.sync.fused"] - before
        bad = _sync_bad(layers, hs, qs, lays)
        res[f"{key}_bit_exact_vs_default"] = not bad
        if bad:
            res[f"{key}_mismatch_weights"] = bad[:4]
        res[f"{key}_graph_ms"] = graph_us(
            [lambda ls=layers: [layer.load_weight(w) for layer, w in zip(ls, weights)]], reps=5) / 1e3
        if fmt == "nvfp4":
            from trace_rl.kernels.weight_quantize import weight_amax_bits, weights_amax_bits, weights_amax_tables

            groups, cur, held = [], [], 0
            for i, w in enumerate(weights):
                cur.append(i)
                held += w.nbytes
                if held >= 1 << 30:          # NativeEngine.SYNC_BATCH_BYTES (not imported: the engine's deps)
                    groups.append(cur)
                    cur, held = [], 0
            groups += [cur] if cur else []
            _garbage(layers, hs)
            for g in groups:                 # the engine's call (eager: its tables are built from the host)
                load_linear_weights([(layers[i], weights[i], None) for i in g])
            bad = _sync_bad(layers, hs, qs, lays)
            res[f"{key}_batched_bit_exact_vs_default"] = not bad
            res[f"{key}_batches"] = len(groups)
            gws = [[weights[i] for i in g] for g in groups]
            tabs = [weights_amax_tables(ws) for ws in gws]      # the same launches, tables built outside the graph

            def batched(ls=layers):
                for g, ws, tab in zip(groups, gws, tabs):
                    bits = weights_amax_bits(ws, tab)
                    for j, i in enumerate(g):
                        ls[i].load_weight(weights[i], None, bits[j:j + 1])

            res[f"{key}_batched_graph_ms"] = graph_us([batched], reps=5) / 1e3
            res["amax_8b_flat_graph_ms"] = graph_us([lambda: [weight_amax_bits(w) for w in weights]], reps=3) / 1e3
            res["amax_8b_batched_graph_ms"] = graph_us(
                [lambda: [weights_amax_bits(ws, tab) for ws, tab in zip(gws, tabs)]], reps=3) / 1e3
            tab1 = weights_amax_tables(weights)
            res["amax_8b_one_launch_graph_ms"] = graph_us([lambda: weights_amax_bits(weights, tab1)], reps=3) / 1e3
        del layers, hs
    except Exception as e:   # noqa: BLE001
        res[f"{key}_error"] = repr(e)[:300]


def bench_quant(read_bw: float, log, fast: bool = False) -> dict:
    """Activation quantization per token, and the 8B weight sync (quantize + re-layout of 252 linears, one CUDA
    graph). `fast`: also time `quantize(..., fast=True)` (the block-tile weight kernel with reciprocal + FMA
    divisions; keys `*_fast_*`), after checking its codes and scales equal the default path's on every weight,
    and `quantize_relayout` (the re-layout fused into the quantize store; `requant_8b_{nvfp4,mxfp4}_fused_*`,
    checked on every weight against the default quantize-then-relayout)."""
    from trace_rl.kernels import quantize
    from trace_rl.kernels.fp4_relayout import relayout
    from trace_rl.kernels.row_quantize import quantize_dequant_bf16

    res = {}
    for M in (1, 64, 512):
        x = torch.randn(M, 4096, device=DEV, dtype=torch.bfloat16)
        res[f"act_nvfp4_row_M{M}_us"] = graph_us([lambda x=x: quantize(x, "nvfp4:row")] * 8)
        res[f"act_w4a4_nvfp4_M{M}_us"] = graph_us([lambda x=x: quantize_dequant_bf16(x, "nvfp4:row")] * 8)
        res[f"act_w4a4_mxfp4_M{M}_us"] = graph_us([lambda x=x: quantize_dequant_bf16(x, "mxfp4")] * 8)
    # weight sync of a Qwen3-8B-shaped model: quantize + Hopper layout for all 252 linears, one CUDA graph
    weights = [torch.randn(n, k, device=DEV, dtype=torch.bfloat16) for _ in range(36) for n, k in QWEN3_8B_LINEARS]
    res["model_8b_params"] = sum(w.numel() for w in weights)
    variants = [(f, d, tag) for f in ("nvfp4", "mxfp4") for d, tag in ((False, ""), (True, "_fast")) if fast or not d]
    for fmt, fd, tag in variants:
        try:
            qs = [quantize(w, fmt, fast=fd) for w in weights]
            if fd:   # same bits as the default path (NaN-free random weights: every block is finite)
                same = all(torch.equal(q.codes, r.codes) and torch.equal(q.scales.view(torch.uint8),
                                                                          r.scales.view(torch.uint8))
                           and (q.global_scale is None or torch.equal(q.global_scale, r.global_scale))
                           for q, r in ((q, quantize(w, fmt, fast=False)) for q, w in zip(qs, weights)))
                res[f"quantize_8b_{fmt}{tag}_bit_exact_vs_default"] = same
            lays = [relayout(q) for q in qs]
            res[f"requant_8b_{fmt}{tag}_graph_ms"] = graph_us(
                [lambda f=fmt, d=fd, ws=weights, ls=lays: [relayout(quantize(w, f, fast=d), out=lay)
                                                           for w, lay in zip(ws, ls)]], reps=3) / 1e3
            if not fd:
                res[f"relayout_8b_{fmt}_graph_ms"] = graph_us(
                    [lambda qs=qs, ls=lays: [relayout(q, out=lay) for q, lay in zip(qs, ls)]], reps=3) / 1e3
            res[f"quantize_8b_{fmt}{tag}_graph_ms"] = graph_us(
                [lambda f=fmt, d=fd, ws=weights: [quantize(w, f, fast=d) for w in ws]], reps=3) / 1e3
            if not fd:            # the engine's sync (fused kernel through QuantLinear.load_weight): same bits
                _bench_engine_sync(fmt, weights, qs, lays, res)
            if fast and not fd:   # quantize with the re-layout fused into its store: same bits as these
                _bench_fused(fmt, weights, qs, lays, res)
            log({k: v for k, v in res.items()                                      # kept on a timeout
                 if f"8b_{fmt}{tag}_" in k or "fused" in k or "engine" in k or "amax" in k})
            del qs, lays
        except Exception as e:   # noqa: BLE001
            res[f"requant_8b_{fmt}{tag}_error"] = repr(e)[:300]
        torch.cuda.empty_cache()
    del weights
    torch.cuda.empty_cache()
    log(res)
    return res
