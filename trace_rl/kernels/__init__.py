"""Triton kernels for FP4/FP8 quantization, the 4-bit-weight GEMM, and the quantized paged KV cache.

Importing this package imports no Triton and touches no GPU: each function imports its kernel module on
first call. `available()` says whether the kernels can run here. Every kernel has a torch reference (the
formats in trace_rl/formats, `PagedKV.write_reference`, `decode_attention_reference`) that it is tested
against; on CPU they run only under Triton's interpreter (TRITON_INTERPRET=1), which is for tests.
"""

from __future__ import annotations

import os

import torch


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def available() -> tuple[bool, str]:
    """(True, "") when Triton is importable and a CUDA device is present (or TRITON_INTERPRET=1)."""
    try:
        import triton  # noqa: F401
    except ImportError as e:
        return False, f"triton is not importable ({e}); install it with `pip install trace-rl[triton]`"
    if interpreting():
        return True, "TRITON_INTERPRET=1: kernels run in Triton's CPU interpreter (slow; for tests)"
    if not torch.cuda.is_available():
        return False, "no CUDA device (set TRITON_INTERPRET=1 to run the kernels in Triton's CPU interpreter)"
    return True, ""


def _check_device(t: torch.Tensor, what: str) -> None:
    if t.is_cuda or interpreting():
        return
    raise RuntimeError(f"{what}: the Triton kernels run on CUDA tensors (got {t.device}); on CPU use the torch "
                       f"reference, or set TRITON_INTERPRET=1 before importing trace_rl.kernels (tests only)")


def quantize(x: torch.Tensor, fmt_name: str, fast: bool | None = None):
    """QTensor bit-exact with `get_format(fmt_name).quantize(x)` for nvfp4, nvfp4:row, mxfp4, fp8_e4m3:row.
    `fast` (None: `row_quantize.FAST_QUANTIZE`): the block-tile weight kernel and reciprocal + FMA divisions,
    same bits (row_quantize.quantize)."""
    _check_device(x, "quantize")
    from trace_rl.kernels.row_quantize import quantize as _quantize

    return _quantize(x, fmt_name, fast)


def quantize_fp8_rows(x: torch.Tensor):
    """FP8 E4M3 per-row quantization (the fp8 backend's activation path): `quantize(x, "fp8_e4m3:row")`."""
    return quantize(x, "fp8_e4m3:row")


def fp4_linear(x: torch.Tensor, packed, act_fmt: str = "bf16", bias: torch.Tensor | None = None) -> torch.Tensor:
    """W4A16 (act_fmt "bf16") or W4A4 (act_fmt == packed.fmt) linear on an nvfp4/mxfp4 PackedWeight."""
    _check_device(x, "fp4_linear")
    from trace_rl.kernels.linear import fp4_linear as _fp4_linear

    return _fp4_linear(x, packed, act_fmt, bias)


def fp4_linear_prequantized(xq: torch.Tensor, row_scale: torch.Tensor | None, packed, bias: torch.Tensor | None = None,
                            out_dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """W4A4 on activations a fused producer already quantized: `xq` bf16 code x block scale, `row_scale` the
    nvfp4:row per-token global (None for mxfp4). See docs/kernels.md."""
    _check_device(xq, "fp4_linear_prequantized")
    from trace_rl.kernels.linear import fp4_linear_prequantized as _pre

    return _pre(xq, row_scale, packed, bias, out_dtype)


def kv_write(cache, slots: torch.Tensor, x: torch.Tensor) -> None:
    """Quantize x [T, H, D] per token and head into PagedKV `cache` at flat slots [T] (int64); bit-exact
    with `cache.write_reference(slots, x)`."""
    _check_device(x, "kv_write")
    from trace_rl.kernels.kv_cache import kv_write as _kv_write

    _kv_write(cache, slots, x)


def qk_norm_rope_kv_write(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                          k_cache, v_cache, slots: torch.Tensor, q_norm_weight: torch.Tensor | None = None,
                          k_norm_weight: torch.Tensor | None = None, eps: float = 1e-6,
                          k_out: torch.Tensor | None = None) -> torch.Tensor:
    """Decode-step prologue in one kernel: q/k RMSNorm (weights given) + RoPE, k/v written to the caches at
    `slots`; returns the rotated q. See docs/kernels.md for shapes; reference
    `attention_reference.qk_norm_rope_kv_write_reference`."""
    _check_device(q, "qk_norm_rope_kv_write")
    from trace_rl.kernels.kv_cache import qk_norm_rope_kv_write as _fused

    return _fused(q, k, v, cos, sin, k_cache, v_cache, slots, q_norm_weight, k_norm_weight, eps, k_out)


def decode_attention(q: torch.Tensor, k, v, block_table: torch.Tensor, seq_lens: torch.Tensor,
                     scale: float, splits: int | None = None) -> torch.Tensor:
    """Paged GQA decode attention reading the quantized cache directly: q [B, Hq, D] -> [B, Hq, D]. `splits`:
    split-KV count over the block table's capacity (None: the launch policy's, `attention_config`)."""
    _check_device(q, "decode_attention")
    from trace_rl.kernels.paged_attention import decode_attention as _decode_attention

    return _decode_attention(q, k, v, block_table, seq_lens, scale, splits=splits)


def decode_attention_gluon(q: torch.Tensor, k, v, block_table: torch.Tensor, seq_lens: torch.Tensor,
                           scale: float) -> torch.Tensor:
    """`decode_attention` over nvfp4 or mxfp4 caches (head_dim 128, 64-token pages, group <= 16) by the Gluon
    warp-specialised kernel (`paged_attention_gluon`): sm_90 and Triton 3.6 only, no interpreter."""
    from trace_rl.kernels.paged_attention_gluon import decode_attention_gluon as _gluon

    return _gluon(q, k, v, block_table, seq_lens, scale)


def decode_attention_reference(q, k, v, block_table, seq_lens, scale):
    """Torch reference of `decode_attention` (gather with PagedKV.read_reference, float32 softmax); any device."""
    from trace_rl.kernels.attention_reference import decode_attention_reference as _ref

    return _ref(q, k, v, block_table, seq_lens, scale)


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float):
    """(weight * rmsnorm(x + residual), x + residual) in one launch; residual None: plain RMSNorm."""
    _check_device(x, "add_rms_norm")
    from trace_rl.kernels.rmsnorm import add_rms_norm as _add_rms_norm

    return _add_rms_norm(x, residual, weight, eps)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """SiLU(gate) * up over the stacked gate/up output [..., 2I] -> [..., I]."""
    _check_device(gate_up, "silu_mul")
    from trace_rl.kernels.swiglu import silu_mul as _silu_mul

    return _silu_mul(gate_up)


def sample_tokens(x: torch.Tensor, seed_state: torch.Tensor, mode: str, temperature: float = 1.0, out=None):
    """Fused sampling (greedy / temperature / from log q) with counter-based noise: (tokens, log-probs)."""
    _check_device(x, "sample_tokens")
    from trace_rl.kernels.sampling import sample as _sample

    return _sample(x, seed_state, mode, temperature, out)
