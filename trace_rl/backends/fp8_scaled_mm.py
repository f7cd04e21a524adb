"""The fp8 backend's `scaled_mm` path: torch's FP8 GEMM (cuBLASLt) on sm_89+, E4M3 on both operands.

- rowwise: activations per token (the `row` reference), weights per row or per tensor (the tensor
  scale is broadcast to a row of scales): `torch._scaled_mm` with [M, 1] and [1, N] float32 scales.
- block: activations in 1x128 blocks, weights in 128x128 blocks (formats `fp8_e4m3:block` and
  `fp8_e4m3:block128x128`). cuBLAS wants the activation scales outer-dim-major ([M, K/128] with
  stride (1, M)). Whether this torch build runs it on this GPU, and with which call and padding, is found
  once per device by `block_support`, which runs a small problem (odd M, K/128 = 3) against the
  emulated reference; if no variant passes, `why_not` says so and the fp8 backend moves on (to
  emulation under `auto` or `allow_fallback`, else an error), with that reason.

Activations are quantized by the formats' reference `quantize`, so the codes are the ones the trainer's
aligned fake quantization produces (tests check this on the GPU).
"""

from __future__ import annotations

import logging

import torch
import torch.nn.functional as F

from trace_rl.backends.base import PackedWeight
from trace_rl.formats import get_format

log = logging.getLogger("trace_rl.backends.fp8")

MIN_CAPABILITY = (8, 9)
_BLOCK_SUPPORT: dict[int, tuple[str | None, str]] = {}


def why_not(device: torch.device, w_fmt: str, act_fmt: str, n: int, k: int) -> str:
    """'' if the scaled_mm path runs this linear on `device`, else why not."""
    if device.type != "cuda":
        return "no CUDA GPU"
    cap = torch.cuda.get_device_capability(device)
    if cap < MIN_CAPABILITY:
        return f"torch's FP8 GEMM needs compute capability >= 8.9; this GPU is sm_{cap[0]}{cap[1]}"
    if act_fmt == "bf16":
        return "weight-only FP8 (bf16 activations) has no _scaled_mm form; it needs FP8 activations (W8A8)"
    w, a = get_format(w_fmt), get_format(act_fmt)
    if w.element != "e4m3" or a.element != "e4m3":
        return f"the scaled_mm path takes E4M3 on both operands, got {w_fmt} x {act_fmt}"
    if n % 16 or k % 16:
        return f"torch's FP8 GEMM needs in/out features divisible by 16, got {k} -> {n}"
    if (w.scaling == "block") != (a.scaling == "block"):
        return (f"weights {w_fmt} with activations {act_fmt}: blocks go with blocks (1x128 x 128x128), "
                f"rows and tensors with rows")
    if w.scaling == "block":
        variant, why = block_support(device)
        return "" if variant else why
    return ""


def linear(x: torch.Tensor, packed: PackedWeight, act_fmt: str, bias: torch.Tensor | None) -> torch.Tensor:
    """y = x @ W^T (+ bias) through torch's FP8 GEMM. `act_fmt` is the per-token activation format."""
    lead, k = x.shape[:-1], x.shape[-1]
    x2 = x.reshape(-1, k)
    qa = get_format(act_fmt).quantize(x2)
    if get_format(packed.fmt).scaling == "block":
        variant, _ = block_support(x.device)
        y = _block_mm(variant, qa.codes, qa.scales, packed.q.codes, _block_weight_scales(packed, variant))
    else:
        y = torch._scaled_mm(qa.codes, packed.q.codes.t(), scale_a=qa.scales.reshape(-1, 1).float(),
                             scale_b=_row_weight_scales(packed), out_dtype=torch.bfloat16)
    if bias is not None:
        y = y + bias.to(y.dtype)
    return y.to(x.dtype).reshape(*lead, packed.out_features)


def _row_weight_scales(packed: PackedWeight) -> torch.Tensor:
    """[1, N] float32 weight scales (a per-tensor scale broadcast), cached in the packed weight's layout."""
    s = packed.layout.get("scale_b")
    if s is None:
        w = packed.q.scales.float()
        s = (w.reshape(1, -1) if w.dim() else w.reshape(1, 1).expand(1, packed.out_features)).contiguous()
        packed.layout["scale_b"] = s
    return s


def _block_weight_scales(packed: PackedWeight, variant: str) -> torch.Tensor:
    """The weight's [N/128, K/128] scales, K blocks padded to a multiple of 4 if the variant wants it."""
    key = f"scale_b.{variant}"
    s = packed.layout.get(key)
    if s is None:
        s = packed.q.scales.float()
        if variant.endswith("padded") and s.shape[1] % 4:
            s = F.pad(s, (0, -s.shape[1] % 4), value=1.0)
        packed.layout[key] = s = s.contiguous()
    return s


def _block_mm(variant: str, a: torch.Tensor, sa: torch.Tensor, w: torch.Tensor, sw: torch.Tensor):
    """a [M, K] fp8 with 1x128 scales sa [M, K/128]; w [N, K] fp8 with 128x128 scales sw [N/128, K/128(+pad)]."""
    m = a.shape[0]
    if variant.endswith("padded") and m % 4:  # zero rows with scale 1 leave the other rows alone
        a = torch.cat([a, a.new_zeros(-m % 4, a.shape[1])])
        sa = torch.cat([sa, sa.new_ones(-m % 4, sa.shape[1])])
    sa = sa.float().t().contiguous().t()  # outer-dim-major, as cuBLAS's VEC128 scale mode reads it
    if variant.startswith("F.scaled_mm"):
        st = F.ScalingType
        y = F.scaled_mm(a, w.t(), sa, st.BlockWise1x128, sw.t(), st.BlockWise128x128,
                        output_dtype=torch.bfloat16)
    else:
        y = torch._scaled_mm(a, w.t(), scale_a=sa, scale_b=sw.t(), out_dtype=torch.bfloat16)
    return y[:m]


_BLOCK_VARIANTS = ("torch._scaled_mm", "F.scaled_mm", "F.scaled_mm.padded", "torch._scaled_mm.padded")


def block_support(device: torch.device) -> tuple[str | None, str]:
    """(the call variant that runs 1x128 x 128x128 block scaling correctly here, or None; why not)."""
    idx = torch.device(device).index
    idx = torch.cuda.current_device() if idx is None else idx
    if idx in _BLOCK_SUPPORT:
        return _BLOCK_SUPPORT[idx]
    dev = torch.device("cuda", idx)
    gen = torch.Generator(device=dev).manual_seed(0)
    m, k, n = 5, 384, 256
    x = torch.randn(m, k, device=dev, generator=gen)
    w = torch.randn(n, k, device=dev, generator=gen)
    qa = get_format("fp8_e4m3:block").quantize(x)
    qw = get_format("fp8_e4m3:block128x128").quantize(w)
    ref = qa.dequantize() @ qw.dequantize().T
    errors = []
    for variant in _BLOCK_VARIANTS:
        if variant.startswith("F.scaled_mm") and not hasattr(F, "scaled_mm"):
            errors.append(f"{variant}: not in torch {torch.__version__}")
            continue
        try:
            sw = qw.scales.float()
            if variant.endswith("padded"):
                sw = F.pad(sw, (0, -sw.shape[1] % 4), value=1.0).contiguous()
            y = _block_mm(variant, qa.codes, qa.scales, qw.codes, sw).float()
            torch.cuda.synchronize(dev)
        except (RuntimeError, TypeError, ValueError) as err:
            errors.append(f"{variant}: {type(err).__name__}: {str(err).splitlines()[0][:200]}")
            continue
        rel = ((y - ref).norm() / ref.norm()).item()
        if rel < 1e-2:
            _BLOCK_SUPPORT[idx] = (variant, "")
            log.info("fp8 scaled_mm: block scaling runs here through %s (rel err %.2e); variants tried "
                     "before it: %s", variant, rel, "; ".join(errors) or "none")
            return _BLOCK_SUPPORT[idx]
        errors.append(f"{variant}: wrong result (relative error {rel:.3g} against the reference)")
    why = (f"torch {torch.__version__} could not run 1x128 x 128x128 block-scaled FP8 GEMMs on this GPU "
           f"({'; '.join(errors)}); block formats are emulated")
    _BLOCK_SUPPORT[idx] = (None, why)
    log.warning("fp8 scaled_mm: %s", why)
    return _BLOCK_SUPPORT[idx]
