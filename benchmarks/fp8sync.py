"""fp8sync (issue 16): the weight sync of a Qwen3-8B-shaped mxfp4 model (36 layers x q, k, v, o, gate, up, down: 252
linears) with the FP8 operand cache, per-weight exactness reads vs one batched read, against the bf16 cache.

Three sets of the same 252 QuantLinears (mxfp4, the same bf16 weights): FP8 caches synced by `load_linear_weights`
with `fp8_sync_check` switched off (`fp8_per_weight_ms`: each cache's refresh reads its inexact count back, the old
behaviour) and on (`fp8_batched_ms`: one read for the sync), and bf16 caches (`bf16_ms`). Wall-clock per sync
(synchronized before and after: the per-weight variant cannot be graph-captured), the three interleaved, median of
`--reps`. Then the E4M3 writer alone at the fused gate/up shape 24576x4096 (`writer_us`: old = through the bf16
operand, direct = the table lookup; CUDA-graph medians), `writers_bit_identical` (both writers' bytes and counts on
all 252 synced weights and a wide-span gate/up weight with inexact values) and `fp8_equals_bf16_x32` (every FP8
cache = its bf16 twin's cache x 32 after the sync). Usage: python benchmarks/fp8sync.py --out OUT.json [--dry]
(--dry: 2 small layers on CPU, the interpreter; the plumbing only).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

LINEARS = [("q_proj", 4096, 4096), ("k_proj", 1024, 4096), ("v_proj", 1024, 4096), ("o_proj", 4096, 4096),
           ("gate_proj", 12288, 4096), ("up_proj", 12288, 4096), ("down_proj", 4096, 12288)]   # (N, K), Qwen3-8B
DRY_LINEARS = [("o_proj", 64, 96), ("down_proj", 32, 160)]
GATE_UP = (24576, 4096)


def _sync(quant_linear, layers, weights, batched: bool, device) -> float:
    """ms of one sync of `weights` into `layers` (load_linear_weights), synchronized around it (measure.wall_s)."""
    import torch

    from trace_rl.bench.measure import wall_s

    if not batched:          # the old behaviour: no deferred check, a host read per FP8 cache
        saved = quant_linear.fp8_sync_check
        quant_linear.fp8_sync_check = contextlib.nullcontext
    try:
        return wall_s(lambda: quant_linear.load_linear_weights([(layer, w, None) for layer, w in zip(layers, weights)]),
                      torch.device(device)) * 1e3
    finally:
        if not batched:
            quant_linear.fp8_sync_check = saved


def _writers_same(f8, q, h, n, k, device, cache=None) -> tuple[bool, int]:
    """(the direct and the old writer give the same bytes and count for q, and `cache` (a synced FP8 cache's buffer)
    holds those bytes; the count)."""
    import torch

    outs, counts = [], []
    for direct in (True, False):
        out = torch.empty(n, k, dtype=torch.float8_e4m3fn, device=device)
        cnt = torch.zeros(1, dtype=torch.int32, device=device)
        f8.write_weight_e4m3(q, h, out, cnt, direct=direct)
        outs.append(out.view(torch.uint8))
        counts.append(int(cnt))
    same = torch.equal(outs[0], outs[1]) and counts[0] == counts[1]
    if cache is not None:
        same = same and torch.equal(cache.view(torch.uint8), outs[1])
    return same, counts[0]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--layers", type=int, default=36)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--dry", action="store_true")
    args = ap.parse_args()
    import torch

    from trace_rl.backends import QuantLinear, quant_linear
    from trace_rl.kernels import operand_cache
    from trace_rl.kernels import operand_cache_fp8 as f8
    from trace_rl.kernels.linear import hopper_weight

    device = "cpu" if args.dry else "cuda"
    linears, nl = (DRY_LINEARS, 2) if args.dry else (LINEARS, args.layers)
    res: dict = {"device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
                 "torch": torch.__version__, "layers": nl, "linears": nl * len(linears), "dry": args.dry}
    t0 = time.time()

    def dump() -> None:          # after every stage: a run cut by its timeout keeps what it measured
        res["wall_s"] = round(time.time() - t0, 1)
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)

    names = [f"layers.{i}.{p}" for i in range(nl) for p, _, _ in linears]
    weights = [(torch.randn(n, k, device=device) * torch.exp(0.5 * torch.randn(n, 1, device=device))).to(torch.bfloat16)
               for _ in range(nl) for _, n, k in linears]
    sets = {}
    for kind in ("fp8_per_weight", "fp8_batched", "bf16"):
        layers = [QuantLinear(w, "mxfp4") for w in weights]
        for layer, name in zip(layers, names):
            if kind == "bf16":
                operand_cache.attach(layer.packed)
            elif f8.attach_fp8(layer.packed, name) is None:
                raise RuntimeError(f"{name}: does not fit E4M3 at attach (the bench's weights should)")
        sets[kind] = layers
    res["setup_s"] = round(time.time() - t0, 1)
    dump()
    times = {k: [] for k in sets}
    for kind, layers in sets.items():            # warm-up: compiles, first-touch
        _sync(quant_linear, layers, weights, kind != "fp8_per_weight", device)
    for _ in range(args.reps):                   # interleaved: drift hits all three alike
        for kind, layers in sets.items():
            times[kind].append(_sync(quant_linear, layers, weights, kind != "fp8_per_weight", device))
    for kind, ts in times.items():
        res[f"{kind}_ms"] = statistics.median(ts)
        res[f"{kind}_all_ms"] = [round(t, 3) for t in ts]
    res["batched_over_bf16"] = res["fp8_batched_ms"] / res["bf16_ms"]
    res["per_weight_over_batched"] = res["fp8_per_weight_ms"] / res["fp8_batched_ms"]
    dump()
    res["fp8_equals_bf16_x32"] = all(
        torch.equal(a.packed.layout[operand_cache.KEY].buf.float(), b.packed.layout[operand_cache.KEY].buf.float() * 32)
        for a, b in zip(sets["fp8_batched"], sets["bf16"]))
    same = True
    for layer in sets["fp8_batched"]:
        ok, cnt = _writers_same(f8, layer.packed.q, hopper_weight(layer.packed), layer.out_features,
                                layer.in_features, device, layer.packed.layout[operand_cache.KEY].buf)
        same = same and ok and cnt == 0
    # the writer alone at the fused gate/up shape, and both writers on a wide-span weight (inexact values)
    from trace_rl.backends import PackedWeight
    from trace_rl.formats import get_format

    n, k = (64, 96) if args.dry else GATE_UP
    w = torch.randn(n, k, device=device) * torch.exp2(
        -torch.randint(0, 25, (n, k // 32), device=device).float()).repeat_interleave(32, dim=1)
    wide = get_format("mxfp4").quantize(w)
    ok, cnt = _writers_same(f8, wide, hopper_weight(PackedWeight("mxfp4", n, k, q=wide)), n, k, device)
    res["wide_span_inexact_values"] = cnt
    res["writers_bit_identical"] = bool(same and ok and cnt > 0)
    dump()
    if not args.dry:
        from trace_rl.engine.timing import graph_median_us
        from trace_rl.kernels import fp4_dequant

        p = QuantLinear(torch.randn(n, k, device=device, dtype=torch.bfloat16), "mxfp4").packed
        h = hopper_weight(p)
        out = torch.empty(n, k, dtype=torch.float8_e4m3fn, device=device)
        cnt = torch.zeros(1, dtype=torch.int32, device=device)
        bf = torch.empty(n, k, dtype=torch.bfloat16, device=device)
        res["writer_us"] = {
            "old": graph_median_us([lambda: f8.write_weight_e4m3(p.q, h, out, cnt, direct=False)] * 4),
            "direct": graph_median_us([lambda: f8.write_weight_e4m3(p.q, h, out, cnt, direct=True)] * 4),
            "bf16_dequant": graph_median_us([lambda: fp4_dequant.dequantize_to(p.q, h, bf)] * 4)}
        res["writer_speedup"] = res["writer_us"]["old"] / res["writer_us"]["direct"]
        # the floor: read codes + scales (~0.53 B / element), write 1 B / element, at ~4.8 TB/s
        res["writer_bytes_floor_us"] = n * k * (1 + 0.5 + 1 / 32) / 4.8e12 * 1e6
    dump()
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
