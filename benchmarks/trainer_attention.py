"""The trainer's attention at the stability study's shape, before and after `causal_attention`'s plan
(trace_rl/kv/causal.py): B=64 sequences x T=1274 tokens, 6 query / 2 K/V heads of 64, float32, `--layers` 8.

- before: the old `causal_attention`, SDPA with `enable_gqa=True` (float32 on CUDA: SDPA's math kernel).
- after: `causal_attention` now (float32 GQA on CUDA: K/V repeated to the query heads, SDPA's efficient kernel).

Per variant: forward over all layers (each layer's own leaf q/k/v, outputs kept as a model keeps them for
backward), then backward; peak `torch.cuda.max_memory_allocated` above the inputs, what the forward keeps
for backward, and median forward / backward ms over the layers. Checks on layer 0: after against before
(output and q/k/v gradients, largest difference relative to the largest value), both against float64 SDPA
(the math kernel in float64), whether two backward passes give bitwise equal gradients, the autograd node
that ran (which SDPA kernel), and torch's own dispatch checks (`can_use_*`, with the refusal reasons).
JSON to --out. `python benchmarks/trainer_attention.py --device cpu --batch 2 --tokens 33 --layers 2` is a
CPU smoke run (CPU keeps `enable_gqa`: before and after are the same call there).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import warnings

import torch
import torch.nn.functional as F

from trace_rl.kv.causal import causal_attention, efficient_takes_gqa, plan_for


def before(q, k, v, scale):
    """`causal_attention` as it was (trace_rl/kv/cache.py before this change)."""
    out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                         is_causal=True, scale=scale, enable_gqa=q.shape[2] != k.shape[2])
    return out.transpose(1, 2)


VARIANTS = {"before": before, "after": causal_attention}


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def rel(a, b) -> float:
    return ((a.double() - b.double()).abs().max() / b.double().abs().max().clamp_min(1e-30)).item()


def dispatch_checks(q, k, v) -> dict:
    """torch's dispatch checks for the GQA call and for the expanded one, with the reasons given."""
    if q.device.type != "cuda":
        return {}
    b = torch.backends.cuda
    g = q.shape[2] // k.shape[2]
    calls = {"gqa": (q, k, v, True), "expanded": (q, k.repeat_interleave(g, 2), v.repeat_interleave(g, 2), False)}
    out = {}
    for name, (qq, kk, vv, gqa) in calls.items():
        params = b.SDPAParams(qq.transpose(1, 2), kk.transpose(1, 2), vv.transpose(1, 2), None, 0.0, True, gqa)
        for kernel in ("flash", "efficient", "cudnn"):
            with warnings.catch_warnings(record=True) as seen:
                warnings.simplefilter("always")
                ok = getattr(b, f"can_use_{kernel}_attention")(params, True)
            out[f"{name}.{kernel}"] = {"ok": bool(ok), "why": [str(w.message)[:300] for w in seen][:3]}
    return out


def run_variant(fn, inputs, grads, device, reps: int) -> dict:
    fwd_ms, bwd_ms = [], []
    keeps = peak = 0
    for rep in range(reps + 1):                       # rep 0 warms up
        for t in inputs:
            for x in t:
                x.grad = None
        sync(device)
        if device.type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device) if device.type == "cuda" else 0
        t0 = time.perf_counter()
        outs = [fn(q, k, v, 0.125) for q, k, v in inputs]
        sync(device)
        t1 = time.perf_counter()
        held = (torch.cuda.memory_allocated(device) - base) if device.type == "cuda" else 0
        torch.autograd.backward(outs, grads)
        sync(device)
        t2 = time.perf_counter()
        node = outs[0].grad_fn
        while node is not None and "Transpose" in node.name():   # the SDPA node under the output transpose
            node = node.next_functions[0][0]
        del outs
        if rep:
            fwd_ms.append((t1 - t0) * 1e3 / len(inputs))
            bwd_ms.append((t2 - t1) * 1e3 / len(inputs))
            keeps = held
            peak = (torch.cuda.max_memory_allocated(device) - base) if device.type == "cuda" else 0
    gib = 2.0 ** 30
    return {"fwd_ms_per_layer": statistics.median(fwd_ms), "bwd_ms_per_layer": statistics.median(bwd_ms),
            "fwd_bwd_ms_all_layers": statistics.median(f + b for f, b in zip(fwd_ms, bwd_ms)) * len(inputs),
            "kept_for_backward_gib": keeps / gib, "peak_gib": peak / gib,
            "sdpa_node": node.name() if node is not None else None}


def layer0(fn, q, k, v, grad):
    q, k, v = (x.detach().clone().requires_grad_() for x in (q, k, v))
    out = fn(q, k, v, 0.125)
    out.backward(grad)
    return [out.detach(), q.grad, k.grad, v.grad]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--tokens", type=int, default=1274)
    p.add_argument("--q-heads", type=int, default=6)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--device", default="cuda")
    p.add_argument("--out", required=True)
    a = p.parse_args()
    device = torch.device(a.device)
    gen = torch.Generator(device=device).manual_seed(0)
    shape = lambda h: (a.batch, a.tokens, h, a.head_dim)            # noqa: E731
    inputs = [tuple(torch.randn(shape(h), device=device, generator=gen).requires_grad_()
                    for h in (a.q_heads, a.kv_heads, a.kv_heads)) for _ in range(a.layers)]
    grads = [torch.randn(shape(a.q_heads), device=device, generator=gen) for _ in range(a.layers)]
    q0, k0, v0 = inputs[0]
    res = {"torch": torch.__version__, "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
           "shape": {"B": a.batch, "T": a.tokens, "Hq": a.q_heads, "Hkv": a.kv_heads, "D": a.head_dim,
                     "layers": a.layers, "dtype": "float32"},
           "math_scores_gib_per_layer": a.batch * a.q_heads * a.tokens ** 2 * 4 / 2.0 ** 30,
           "plan": plan_for(q0, k0),
           "efficient_takes_gqa": efficient_takes_gqa(device) if device.type == "cuda" else None,
           "dispatch": dispatch_checks(q0, k0, v0)}
    # Checks first (layer 0), so a memory failure in the timing still leaves them.
    outs = {name: layer0(fn, q0, k0, v0, grads[0]) for name, fn in VARIANTS.items()}
    ref = layer0(before, *(x.double() for x in (q0, k0, v0)), grads[0].double())   # float64: math kernel
    names = ("out", "dq", "dk", "dv")
    res["after_vs_before"] = {n: rel(x, y) for n, x, y in zip(names, outs["after"], outs["before"])}
    for name in VARIANTS:
        res[f"{name}_vs_float64"] = {n: rel(x, y) for n, x, y in zip(names, outs[name], ref)}
    again = layer0(causal_attention, q0, k0, v0, grads[0])
    res["after_bitwise_repeatable"] = {n: bool(torch.equal(x, y)) for n, x, y in zip(names, outs["after"], again)}
    del outs, ref, again
    for name, fn in VARIANTS.items():
        try:
            res[name] = run_variant(fn, inputs, grads, device, a.reps)
        except torch.OutOfMemoryError as e:
            res[name] = {"error": f"out of memory: {str(e)[:300]}"}
        if device.type == "cuda":
            torch.cuda.empty_cache()
    if "peak_gib" in res.get("before", {}) and "peak_gib" in res.get("after", {}):
        b, f = res["before"], res["after"]
        res["summary"] = {"peak_gib_before_after": [round(b["peak_gib"], 3), round(f["peak_gib"], 3)],
                          "kept_gib_before_after": [round(b["kept_for_backward_gib"], 3),
                                                    round(f["kept_for_backward_gib"], 3)],
                          "speedup_fwd_bwd": b["fwd_bwd_ms_all_layers"] / f["fwd_bwd_ms_all_layers"]}
    with open(a.out, "w") as fh:
        json.dump(res, fh, indent=1)
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
