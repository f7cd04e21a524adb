"""GPU (issue 16): the fused SiLU x mul is torch's `F.silu(gate) * up` bit for bit (`kernels.swiglu.EXACT_SILU`:
libdevice expf + IEEE division, swiglu.py's doc), so fusing it changes no bits:
- `swiglu.silu_mul` against torch over every bf16 gate (all 65536 patterns: -0, +-inf, NaNs, subnormals, the
  largest) with random-bit ups, and over random rows of many magnitudes at the Qwen3-8B MLP shape;
- the W4A4 quantize with SiLU x mul fused (`quantize_dequant_bf16(gate | up, silu_mul=True)`, the block-tile
  kernel up to 16K columns and the general kernel past them) against torch's product quantized apart;
- engine A/B: a decode step's logits with `decoder.FUSE_ROLLOUT_SILU_QUANTIZE` on and off (tiny w4a4-kv4 model,
  operand cache stacked, every step above the cache threshold), bit-identical, the fused path taken.
NaN payloads are compared apart from the other bits (NaN positions must match; payloads are reported)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def torch_silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def bits_mismatch(a: torch.Tensor, b: torch.Tensor) -> dict:
    """Where two bf16 tensors differ: non-NaN bits, NaN positions, NaN payloads (counts)."""
    ia, ib = a.view(torch.int16), b.view(torch.int16)
    na, nb = a.isnan(), b.isnan()
    both = na & nb
    return {"bits": int(((ia != ib) & ~na & ~nb).sum()), "nan_positions": int((na != nb).sum()),
            "nan_payloads": int(((ia != ib) & both).sum()), "nans": int(both.sum())}


def every_bf16_gate(rows: int, gen: torch.Generator) -> torch.Tensor:
    """[rows, 2 * 65536] bf16: gate = every bf16 bit pattern, up = random bits (any class) per element."""
    g = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)
    u = torch.randint(-32768, 32768, (rows, g.numel()), generator=gen, dtype=torch.int32).to(torch.int16)
    u[0] = torch.tensor(1.0, dtype=torch.bfloat16).view(torch.int16)            # row 0: silu(g) itself
    return torch.cat([g.expand(rows, -1), u.view(torch.bfloat16)], dim=1).cuda()


def magnitudes(rows: int, i: int, gen: torch.Generator) -> torch.Tensor:
    """[rows, 2i] bf16 normals, each row scaled by its own 2**[-30, 30] (exp's range reduction at every scale)."""
    x = torch.randn(rows, 2 * i, generator=gen) * torch.exp2(torch.randint(-30, 31, (rows, 1), generator=gen).float())
    return x.to(torch.bfloat16).cuda()


def test_silu_mul_every_bf16_gate_bit_identical():
    from trace_rl.kernels import swiglu

    assert swiglu.EXACT_SILU
    x = every_bf16_gate(8, torch.Generator().manual_seed(0))
    got, want = swiglu.silu_mul(x), torch_silu_mul(x)
    miss = bits_mismatch(got, want)
    print(f"every bf16 gate x 8 ups: {miss}")
    assert miss["bits"] == 0 and miss["nan_positions"] == 0, miss


@pytest.mark.parametrize("rows,i", [(313, 12288), (7, 1100), (1, 5)])
def test_silu_mul_random_magnitudes_bit_identical(rows, i):
    from trace_rl.kernels import swiglu

    x = magnitudes(rows, i, torch.Generator().manual_seed(rows))
    miss = bits_mismatch(swiglu.silu_mul(x), torch_silu_mul(x))
    assert miss["bits"] == 0 and miss["nan_positions"] == 0, miss


@pytest.mark.parametrize("fmt", ["nvfp4:row", "mxfp4"])
@pytest.mark.parametrize("rows,i", [(313, 12288), (5, 16416), (3, 768)])
def test_fused_quantize_bit_identical_with_separate(fmt, rows, i):
    """quantize_dequant_bf16(gate | up, silu_mul=True) == quantize_dequant_bf16(F.silu(gate) * up): operand bits and
    row scales (16416 columns: past the block-tile kernel's 16K, the general kernel)."""
    from trace_rl.kernels.row_quantize import quantize_dequant_bf16

    x = magnitudes(rows, i, torch.Generator().manual_seed(i))
    if rows > 3:                    # a row with the special values (its blocks: the NaN scale, as apart)
        x[1, :8] = torch.tensor([float("inf"), float("-inf"), float("nan"), -0.0, 1e38, -1e38, 1e-39, -1e-39])
    fused, fused_scale = quantize_dequant_bf16(x, fmt, silu_mul=True)
    apart, apart_scale = quantize_dequant_bf16(torch_silu_mul(x).contiguous(), fmt)
    miss = bits_mismatch(fused, apart)
    assert miss["bits"] == 0 and miss["nan_positions"] == 0, miss
    if fmt == "nvfp4:row":
        assert torch.equal(fused_scale.view(torch.int32), apart_scale.view(torch.int32))


def _tiny_engine(preset: str = "w4a4-kv4"):
    from trace_rl.engine.native import NativeEngine
    from trace_rl.models import tiny_model
    from trace_rl.plan import PrecisionPlan

    plan = PrecisionPlan.preset(preset)
    model, _ = tiny_model("tiny", seed=3, device="cuda", dtype=torch.bfloat16)
    return NativeEngine(model, plan, max_batch=9, max_seq_len=96, block_size=16, attention="kernels",
                        operand_cache=True, graph_buckets=[9])


@pytest.mark.parametrize("plan", ["w4a4-kv4", "w4a4-kv4-mx"])
def test_engine_logits_bit_identical_fused_or_apart(monkeypatch, plan):
    from trace_rl.backends import get_backend
    from trace_rl.bench.decode_grid import prime_decode
    from trace_rl.kernels import fp4_dequant
    from trace_rl.models import decoder, linear

    monkeypatch.setattr(linear, "SILU_QUANTIZE_MIN_ROWS", 1)        # B = 9: fused too

    monkeypatch.setattr(fp4_dequant, "DEQUANT_CUBLAS_MIN_M", 1)     # every step reads the (stacked) operand caches
    monkeypatch.setattr(decoder, "FUSE_ROLLOUT_EPILOGUE_SILU_QUANTIZE", False)   # this SiLU fusion alone (the
    # epilogue's fused into it: tests/engine/test_mlp_fuse_gpu.py)
    engine = _tiny_engine(plan)
    count = get_backend("fp4").paths.counts.get
    B, L = 9, 41

    def logits():
        prime_decode(engine, B, L)
        path = engine.attention_path(B, L)
        with torch.no_grad():
            return engine._decode_forward(B, path, engine.attention_span(path, L)).float().clone()

    layers = len(engine.model.model.layers)
    engine.attention_path(B, L)                     # its choice (timed once) before the counts
    before, stacked = count("fp4.silu_mul_quantize", 0), count("fp4.operand_stack_cublas", 0)
    fused = logits()
    assert count("fp4.silu_mul_quantize", 0) - before == layers
    if plan == "w4a4-kv4":          # nvfp4: q/k/v and gate/up stacked by the operand cache (mxfp4: fused Linears)
        assert count("fp4.operand_stack_cublas", 0) - stacked == 2 * layers
    monkeypatch.setattr(decoder, "FUSE_ROLLOUT_SILU_QUANTIZE", False)
    apart = logits()
    assert count("fp4.silu_mul_quantize", 0) - before == layers
    print(f"engine logits fused vs apart: {float((fused == apart).float().mean()):.6f} identical")
    assert torch.equal(fused.view(torch.int32), apart.view(torch.int32))
    # the captured step runs the fused path too (graphs re-captured after the switch)
    monkeypatch.setattr(decoder, "FUSE_ROLLOUT_SILU_QUANTIZE", True)
    engine.graphs.invalidate()
    prime_decode(engine, B, L)
    captured = count("fp4.silu_mul_quantize", 0)
    engine.decode_step(B, L, (1.0, 0, 1.0))
    torch.cuda.synchronize()
    assert engine.graphs.captured and count("fp4.silu_mul_quantize", 0) > captured
