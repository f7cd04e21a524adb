"""The pairs benchmarks/w4a4_producers.py times: one decoder projection with the kernel that produces its input, W4A4
as the engine runs it (the producer emits the quantized operand, `fp4_linear_prequantized`) against W4A16 as it would
run (the producer, then `fp4_linear` on bf16), plus cuBLAS BF16 and W4A4 with its separate quantize launch. Plain
functions of tensors (no timing, no CUDA), so tests/benchmarks/test_w4a4_producers.py runs them on CPU in Triton's
interpreter at a tiny shape.

Pairs (Qwen3-8B, hidden 4096, intermediate 12288, 32 x 128 query heads; K x N of the projection):
- `layer_input` 4096x6144 (q/k/v stacked; 4096x12288 gate/up is the same pair at another N): residual add + RMSNorm
  -> projection. W4A16: `add_rms_norm` (what RMSNorm.add runs) + `fp4_linear`; W4A4: `add_rms_norm_quantize(...,
  store_h=False)` (what `FP4Backend.norm_quantize_input` runs, models/norm_input.py) + `fp4_linear_prequantized`.
- `mlp_down` 12288x4096: SiLU x mul of gate | up [M, 2 x 12288] -> down_proj. W4A16: `swiglu.silu_mul` (the one-launch
  kernel; nvfp4's W4A16 engine runs torch's F.silu and multiply, two launches: this W4A16 is the faster reference) +
  `fp4_linear`; W4A4: `quantize_dequant_bf16(gate_up, silu_mul=True)` (what `FP4Backend.quantize_silu_mul_input`
  runs, models.linear.silu_mul_linear) + `fp4_linear_prequantized`.
- `o_proj` 4096x4096: the attention output -> o_proj, no producer of ours in between. W4A4 as the engine runs it today:
  `fp4_linear(a, p, fmt)` (its quantize launch + the GEMM); `w4a4` here is the GEMM on an operand quantized once
  outside the graph (what a quantize fused into the attention epilogue would leave); `quantize_alone` the launch that
  fusion would remove.
Every pair also has `w4a4_apart`: the producer, then `fp4_linear(..., fmt)` (its own quantize launch). mlp_down also
has `w4a16_torch_silu` / `w4a4_torch_silu_apart`: torch's F.silu(gate) * up (two launches) before `fp4_linear`, what
MLP.forward runs for nvfp4 where gate and up come out of two GEMMs (W4A16 always; W4A4 below the operand stack).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from trace_rl.formats import per_token
from trace_rl.kernels.linear import fp4_linear, fp4_linear_prequantized
from trace_rl.kernels.rmsnorm import add_rms_norm
from trace_rl.kernels.rmsnorm_quantize import add_rms_norm_quantize
from trace_rl.kernels.row_quantize import quantize_dequant_bf16
from trace_rl.kernels.swiglu import silu_mul

EPS = 1e-6
PAIRS = {"layer_input": (4096, 6144), "mlp_down": (12288, 4096), "o_proj": (4096, 4096)}     # name: (K, N)
FMTS = ("nvfp4", "mxfp4")


def make_inputs(pair: str, M: int, K: int, device, dtype=torch.bfloat16, gen: torch.Generator | None = None) -> dict:
    """The pair's producer inputs at M rows: x, residual, norm weight (layer_input); gate | up [M, 2K] (mlp_down);
    the attention output a (o_proj). Decode-like magnitudes (a residual stream of a few units)."""
    rnd = lambda *s: torch.randn(*s, generator=gen)  # noqa: E731
    if pair == "layer_input":
        return {"x": (rnd(M, K) * 2).to(device, dtype), "r": (rnd(M, K) * 4).to(device, dtype),
                "norm_w": (torch.rand(K, generator=gen) + 0.5).to(device, dtype)}
    if pair == "mlp_down":
        return {"gate_up": (rnd(M, 2 * K) * 2).to(device, dtype)}
    if pair == "o_proj":
        return {"a": rnd(M, K).to(device, dtype)}
    raise ValueError(f"unknown pair {pair!r}; one of {list(PAIRS)}")


# -- the producers: what the projection reads -----------------------------------------------------------------------

def produce_bf16(pair: str, inp: dict) -> torch.Tensor:
    """The bf16 input the W4A16 / BF16 projection reads (the unfused producer's output)."""
    if pair == "layer_input":
        return add_rms_norm(inp["x"], inp["r"], inp["norm_w"], EPS)[0]
    if pair == "mlp_down":
        return silu_mul(inp["gate_up"])
    return inp["a"]


def produce_quantized(pair: str, inp: dict, fmt: str) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(xq, row_scale): the W4A4 operand from the fused producer (layer_input, mlp_down) as the engine's fp4 backend
    emits it; o_proj has none (its quantize is a launch of its own: `quantize_alone`)."""
    act = per_token(fmt)
    if pair == "layer_input":
        _, _, xq, rs = add_rms_norm_quantize(inp["x"], inp["r"], inp["norm_w"], EPS, act, store_h=False)
        return xq, rs
    if pair == "mlp_down":
        return quantize_dequant_bf16(inp["gate_up"], act, silu_mul=True)
    return quantize_dequant_bf16(inp["a"], act)


def produce_apart(pair: str, inp: dict, fmt: str) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The same operand from the unfused producer and the separate quantize kernel (what `fp4_linear(.., fmt)` runs
    first): the fused producer must give these bits."""
    h = produce_bf16(pair, inp)
    return quantize_dequant_bf16(h.reshape(-1, h.shape[-1]), per_token(fmt))


# -- the variants: producer + projection ---------------------------------------------------------------------------

def _torch_silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """MLP.forward's `F.silu(gate) * up` (two launches) where gate and up come out of two GEMMs."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def _dtype(inp: dict) -> torch.dtype:
    """The activations' dtype: the output's (`FP4Backend.linear_quantized` passes the input's dtype as out_dtype)."""
    return next(iter(inp.values())).dtype


def variants(pair: str, fmt: str, prequant: tuple | None = None) -> dict:
    """name -> fn(inp, p, w_bf16) -> output [M, N], one call of that variant (p: the FP4 PackedWeight, w_bf16 the
    bf16 weight). `prequant`: o_proj's operand quantized once outside the graph (for its `w4a4`)."""
    out = {
        "bf16": lambda inp, p, w: F.linear(produce_bf16(pair, inp), w),
        "w4a16": lambda inp, p, w: fp4_linear(produce_bf16(pair, inp), p),
        "w4a4_apart": lambda inp, p, w: fp4_linear(produce_bf16(pair, inp), p, fmt),
    }
    if pair == "mlp_down":      # nvfp4's engine today, gate/up apart below the operand stack: torch's SiLU and multiply
        out["w4a16_torch_silu"] = lambda inp, p, w: fp4_linear(_torch_silu_mul(inp["gate_up"]), p)
        out["w4a4_torch_silu_apart"] = lambda inp, p, w: fp4_linear(_torch_silu_mul(inp["gate_up"]), p, fmt)
    if pair == "o_proj":
        if prequant is not None:
            out["w4a4"] = lambda inp, p, w: fp4_linear_prequantized(prequant[0], prequant[1], p, None, _dtype(inp))
        out["quantize_alone"] = lambda inp, p, w: produce_quantized(pair, inp, fmt)
    else:
        out["w4a4"] = lambda inp, p, w: fp4_linear_prequantized(*produce_quantized(pair, inp, fmt), p, None,
                                                                 _dtype(inp))
        out["producer_w4a16"] = lambda inp, p, w: produce_bf16(pair, inp)
        out["producer_w4a4"] = lambda inp, p, w: produce_quantized(pair, inp, fmt)
    return out


# -- checks ------------------------------------------------------------------------------------------------------

def same_bits(a: torch.Tensor | None, b: torch.Tensor | None) -> bool:
    """Equal bit for bit (NaN positions compared, NaN payloads not)."""
    if a is None or b is None:
        return a is None and b is None
    if a.shape != b.shape or a.dtype != b.dtype or not torch.equal(a.isnan(), b.isnan()):
        return False
    ok = ~a.isnan()
    view = {2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
    return bool(torch.equal(a.view(view)[ok], b.view(view)[ok]))


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def check_pair(pair: str, fmt: str, inp: dict, p, w_bf16: torch.Tensor) -> dict:
    """What the bench reports next to the timings (one call each, outside any graph):
    - `operand_bits`: the fused producer's (xq, row_scale) = the unfused producer + the separate quantize (layer_input,
      mlp_down);
    - `output_bits`: W4A4 fused = W4A4 apart, the whole pair's output bit for bit (same operand, same GEMM);
    - `rel_w4a4_vs_w4a16`, `rel_w4a16_vs_bf16`: relative Frobenius differences (quantization noise, for scale)."""
    v = variants(pair, fmt, produce_quantized(pair, inp, fmt) if pair == "o_proj" else None)
    res = {}
    if pair != "o_proj":
        fq, fr = produce_quantized(pair, inp, fmt)
        aq, ar = produce_apart(pair, inp, fmt)
        res["operand_bits"] = same_bits(fq, aq) and same_bits(fr, ar)
    y4, ya, y16, yb = (v[n](inp, p, w_bf16) for n in ("w4a4", "w4a4_apart", "w4a16", "bf16"))
    res["output_bits"] = same_bits(y4, ya)
    res["finite"] = bool(torch.isfinite(y4).all() and torch.isfinite(y16).all())
    res["rel_w4a4_vs_w4a16"] = rel(y4, y16)
    res["rel_w4a16_vs_bf16"] = rel(y16, yb)
    return res
