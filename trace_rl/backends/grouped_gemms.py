"""The grouped GEMMs the experts' paths call (backends/grouped_linear.py says which path runs when):
`grouped_mm` (`torch._grouped_mm` where its fast path runs, else `grouped_loop`), `grouped_loop` (a reference
loop over the experts), and the FP8 path `fp8_grouped` (`torch._scaled_grouped_mm` over E4M3 codes) with its
checks (`fp8_grouped_why_not` for a layer, `fp8_grouped_support` once per device)."""

from __future__ import annotations

import logging

import torch

from trace_rl.op_ranges import op_range

log = logging.getLogger("trace_rl.backends.grouped_linear")

FP8_GROUPED_ALIGN = 16
_FP8_GROUPED_SUPPORT: dict[int, str] = {}      # device index -> "" (runs) or why not


def grouped_mm_runs(x: torch.Tensor, w: torch.Tensor) -> bool:
    """Does `torch._grouped_mm` run here without a host sync (and with autograd where it is needed)?"""
    if not hasattr(torch, "_grouped_mm") or x.dtype != w.dtype:
        return False
    if x.is_cuda:
        # the CUTLASS fast path; torch's fallback reads the offsets on the host (a sync)
        return x.dtype == torch.bfloat16 and torch.cuda.get_device_capability(x.device)[0] in (9, 10)
    needs_grad = torch.is_grad_enabled() and (x.requires_grad or w.requires_grad)
    # CPU: forward only (torch 2.13's CPU backward of _grouped_mm fails: "Invalid strides/sizes")
    return x.device.type == "cpu" and x.dtype in (torch.float32, torch.bfloat16) and not needs_grad


def grouped_mm(x: torch.Tensor, w: torch.Tensor, ends: torch.Tensor, path: str | None = None) -> torch.Tensor:
    """y[r] = x[r] @ w[e]^T for the rows r of expert e's group; x [rows, K], w [E, N, K], ends [E] int32.

    `path`: None picks `grouped_mm` where it runs, else `loop`. Rows past ends[-1]: unspecified."""
    path = path or ("grouped_mm" if grouped_mm_runs(x, w) else "loop")
    if path == "grouped_mm":
        return torch._grouped_mm(x, w.transpose(1, 2), offs=ends)
    if path != "loop":
        raise ValueError(f"grouped_mm path {path!r}; known: grouped_mm, loop")
    return grouped_loop(x, ends, lambda e, rows: rows @ w[e].to(rows.dtype).T, w.shape[1])


def grouped_loop(x: torch.Tensor, ends: torch.Tensor, linear, out_features: int) -> torch.Tensor:
    """The reference: `linear(e, x[group e])` per non-empty group (the bounds are read on the host)."""
    bounds = [0, *ends.tolist()]
    parts = []
    for e in range(len(bounds) - 1):
        lo, hi = bounds[e], bounds[e + 1]
        if hi > lo:
            parts.append(linear(e, x[lo:hi]))
    parts.append(x.new_zeros(x.shape[0] - bounds[-1], out_features))
    return torch.cat(parts)


def fp8_grouped_why_not(device: torch.device, weight_fmt: str, act_fmt: str, n: int, k: int, backend) -> str:
    """'' when `fp8_grouped` runs these experts on `device` with the numerics of the fp8 backend's dense linears,
    else why not."""
    if device.type != "cuda":
        return "no CUDA device"
    if not (weight_fmt.startswith("fp8_e4m3:") and act_fmt == "fp8_e4m3:row"):
        return (f"fp8_grouped takes E4M3 weights (per row or tensor) with E4M3 per-token activations, "
                f"got {weight_fmt} x {act_fmt}")
    if weight_fmt not in ("fp8_e4m3:row", "fp8_e4m3:tensor"):
        return f"{weight_fmt}: block-scaled weights have no grouped scaled GEMM in torch"
    if not hasattr(torch, "_scaled_grouped_mm"):
        return f"torch {torch.__version__} has no torch._scaled_grouped_mm"
    cap = torch.cuda.get_device_capability(device)
    if cap != (9, 0):
        return f"torch._scaled_grouped_mm's FP8 rowwise kernel is built for sm_90; this GPU is sm_{cap[0]}{cap[1]}"
    if n % 16 or k % 16:
        return f"torch's FP8 GEMMs need in/out features divisible by 16, got {k} -> {n}"
    dense = backend.available(device, weight_fmt, act_fmt).path
    if dense != "fp8.scaled_mm.rowwise":
        return f"the fp8 backend's dense linears take {dense}; fp8_grouped matches fp8.scaled_mm.rowwise only"
    return fp8_grouped_support(device)


def fp8_grouped(x: torch.Tensor, ends: torch.Tensor, codes: torch.Tensor, scale_b: torch.Tensor,
                act_fmt: str = "fp8_e4m3:row") -> torch.Tensor:
    """Rows of x [R, K] sorted by expert through E4M3 expert weights `codes` [E, N, K] with per-row scales
    `scale_b` [E, N] float32: each row quantized per token (on CUDA by `kernels.row_quantize`, bit for bit the
    format reference the dense `fp8.scaled_mm.rowwise` linear runs), then one `torch._scaled_grouped_mm` (fp32
    accumulation, bf16 out).
    Rows past ends[-1]: unspecified."""
    from trace_rl.formats import get_format

    with op_range("quantization"):
        if x.is_cuda and act_fmt == "fp8_e4m3:row":
            # one Triton launch, the format reference's codes and scales bit for bit (call 2, H200: the
            # reference's ~8 torch kernels per call took ~18 ms of an fp8 decode step over all linears)
            from trace_rl.kernels.row_quantize import quantize as quantize_rows

            qa = quantize_rows(x, act_fmt)
        else:
            qa = get_format(act_fmt).quantize(x)
    y = torch._scaled_grouped_mm(qa.codes, codes.transpose(1, 2), qa.scales.reshape(-1).float(), scale_b,
                                 offs=ends, out_dtype=torch.bfloat16)
    return y.to(x.dtype)


def fp8_grouped_support(device: torch.device) -> str:
    """'' if `torch._scaled_grouped_mm` runs here and equals per-expert `torch._scaled_mm` on a small problem
    (odd groups, an empty one); else why not (logged once, the experts then take `loop`)."""
    idx = torch.device(device).index
    idx = torch.cuda.current_device() if idx is None else idx
    if idx in _FP8_GROUPED_SUPPORT:
        return _FP8_GROUPED_SUPPORT[idx]
    from trace_rl.formats import get_format

    dev = torch.device("cuda", idx)
    gen = torch.Generator(device=dev).manual_seed(0)
    e, n, k = 3, 48, 64
    w = get_format("fp8_e4m3:row").quantize(torch.randn(e * n, k, device=dev, generator=gen))
    codes, scale_b = w.codes.view(e, n, k), w.scales.float().view(e, n)
    ends = torch.tensor([16, 16, 48], dtype=torch.int32, device=dev)
    x = torch.randn(48, k, device=dev, generator=gen, dtype=torch.bfloat16)
    try:
        got = fp8_grouped(x, ends, codes, scale_b).float()
        qa = get_format("fp8_e4m3:row").quantize(x)
        want = torch.cat([torch._scaled_mm(qa.codes[lo:hi], codes[g].t(), scale_a=qa.scales[lo:hi].float(),
                                           scale_b=scale_b[g].view(1, -1), out_dtype=torch.bfloat16).float()
                          for g, lo, hi in ((0, 0, 16), (2, 16, 48))])       # expert 1's group is empty
        rel = float((got - want).norm() / want.norm())
        why = "" if rel < 1e-2 else f"torch._scaled_grouped_mm differs from per-expert torch._scaled_mm (rel {rel:.3g})"
    except (RuntimeError, TypeError, ValueError, NotImplementedError) as err:
        why = f"torch._scaled_grouped_mm fails here: {type(err).__name__}: {str(err).splitlines()[0][:200]}"
    if why:
        log.warning("fp8_grouped: %s; FP8 experts take the per-expert loop (no CUDA graphs)", why)
    _FP8_GROUPED_SUPPORT[idx] = why
    return why
