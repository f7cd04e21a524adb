"""Which grouped (mixture-of-experts) FP4 GEMM `kernels.linear.fp4_grouped_linear` runs: the Gluon persistent kernel
(fp4_grouped_gluon.py) or the Triton `fp4_grouped.fp4_grouped_matmul`.

The Gluon kernel runs where all of these hold, else the Triton one (H200, 2026-12-02, check `moegluon`; the numbers
are in fp4_grouped_gluon.py above TILE_RULE):
- `GLUON_GROUPED` is on and the caller passed no explicit Triton GemmConfig;
- not W4A4 with the activation quantize fused into the Triton kernel (`fp4_grouped.FUSE_ACT_QUANT`, off by
  default): the Gluon kernel takes prequantized rows (the separate quantize launch's code x scale and row scale);
- an sm_90 GPU with Triton 3.6's Gluon importable;
- the launcher takes the shape: nvfp4 / mxfp4, padded K a multiple of the K step (256 / 512 columns; then the scale
  rows are 16-byte aligned for TMA): mxfp4 at K = 768 (the Qwen3-30B-A3B down projection) takes Triton;
- the mean rows per expert is where the H200 measured the Gluon tile faster: up to GLUON_MAX_MEAN (32: B = 512 at
  top-8 of 128 experts; nothing above was measured) and outside TRITON_FASTER (empty since check `moe512`: mxfp4 at
  20-28 rows, B = 409, had Triton 105.7 us vs the 32-token tile's 116.4 on the gate_up GEMM; the 32x64ob tile
  now takes it in 100.7 vs Triton's 105.3).
The rule reads the rows of the buffer, not the router's counts (on the device: the launch must not synchronise),
and not N: the stacked gate | up GEMM and the unstacked gate and up take the same kernel and tile (their bits are
compared). This is a dispatch rule, not a fallback: `grouped_path` is a pure function of what it is given (tested
on CPU), the first decision of each kind is logged once per process (`log_path`), and the grouped linear records
`experts.fp4_grouped.gluon` / `experts.fp4_grouped.triton` in the backend's path counts.
"""

from __future__ import annotations

import functools
import logging

from trace_rl.kernels.fp4_gemm_gluon_config import step_k

log = logging.getLogger("trace_rl.kernels")

GLUON_GROUPED = True      # module switch: False sends every grouped FP4 GEMM to the Triton fp4_grouped_matmul
GLUON_MAX_MEAN = 32       # mean rows per expert measured on the H200 (B = 512 of top-8 / 128): above, Triton
# mean rows per expert (lo, hi] where the Triton kernel beat every Gluon tile on the H200
TRITON_FASTER = {"nvfp4": (), "mxfp4": ()}


def grouped_path(fmt: str, k_padded: int, rows: int, n_experts: int, capability: tuple[int, int] | None,
                 gluon: bool, explicit_config: bool = False, fused_act_quant: bool = False, bias_ok: bool = True,
                 enabled: bool = True) -> tuple[str, str]:
    """("gluon" | "triton", why) for a grouped FP4 GEMM of `rows` buffer rows over `n_experts` experts of format
    `fmt` whose Hopper layout has `k_padded` columns, on a device of compute `capability` (None: not CUDA). `gluon`:
    Triton 3.6's Gluon is importable; `explicit_config`: the caller passed a Triton GemmConfig; `fused_act_quant`:
    W4A4 quantizing inside the Triton kernel; `bias_ok`: no bias or a contiguous [E, N] one; `enabled`:
    GLUON_GROUPED."""
    if not enabled:
        return "triton", "GLUON_GROUPED is off"
    if explicit_config:
        return "triton", "an explicit Triton GemmConfig was given"
    if fused_act_quant:
        return "triton", ("W4A4 with the activation quantize fused into the Triton kernel (FUSE_ACT_QUANT); the "
                          "Gluon kernel takes prequantized rows")
    if rows < 1:
        return "triton", "no rows"
    if capability != (9, 0):
        return "triton", f"not an sm_90 GPU (capability {capability})"
    if not gluon:
        return "triton", "Triton 3.6's Gluon is not importable"
    if fmt not in TRITON_FASTER:
        return "triton", f"format {fmt}"
    if k_padded % step_k(fmt):
        return "triton", (f"{fmt}: K pads to {k_padded}, not a multiple of the Gluon kernel's {step_k(fmt)}-column "
                          f"K step (and 16-byte scale rows)")
    if not bias_ok:
        return "triton", "a bias that is not a contiguous [E, N] tensor"
    mean = rows / max(n_experts, 1)
    if mean > GLUON_MAX_MEAN:
        return "triton", f"{fmt}: more than {GLUON_MAX_MEAN} rows per expert on average (not measured)"
    for lo, hi in TRITON_FASTER[fmt]:
        if lo < mean <= hi:
            return "triton", f"{fmt}: {lo}-{hi} rows per expert on average, where the Triton kernel measured faster"
    return "gluon", (f"{fmt}: sm_90, up to {GLUON_MAX_MEAN} rows per expert on average: fp4_grouped_gluon "
                     f"(token tile by TILE_RULE)")


@functools.cache
def grouped_gluon_available() -> bool:
    """Triton 3.6 with its experimental Gluon API and the grouped Gluon module importable (the launcher is pinned to
    3.6's API)."""
    import triton

    if not triton.__version__.startswith("3.6"):
        return False
    try:
        import trace_rl.kernels.fp4_grouped_gluon  # noqa: F401
    except Exception as e:   # noqa: BLE001 -- the rule's input: reported by `log_path`, not swallowed
        log.info("the grouped Gluon FP4 GEMM is not importable: %r", e)
        return False
    return True


_LOGGED: set = set()


def log_path(path: str, why: str) -> None:
    """logger.info once per process and (path, reason): which kernel the grouped FP4 GEMMs take."""
    key = (path, why)
    if key not in _LOGGED:
        _LOGGED.add(key)
        log.info("grouped FP4 GEMMs take the %s kernel: %s",
                 "Gluon fp4_grouped_gluon" if path == "gluon" else "Triton fp4_grouped_matmul", why)


def grouped_gemm(rows: int, device, fmt: str, k_padded: int, n_experts: int, explicit_config: bool = False,
                 fused_act_quant: bool = False, bias_ok: bool = True) -> str:
    """`grouped_path` for a grouped GEMM of `rows` rows on `device` (a torch.device), logged; "gluon" or
    "triton"."""
    cap = None
    if device.type == "cuda":
        import torch

        from trace_rl.kernels.gemm_dispatch import device_capability

        cap = device_capability(device.index if device.index is not None else torch.cuda.current_device())
    gluon = cap == (9, 0) and GLUON_GROUPED and grouped_gluon_available()
    path, why = grouped_path(fmt, k_padded, rows, n_experts, cap, gluon, explicit_config, fused_act_quant, bias_ok,
                             GLUON_GROUPED)
    log_path(path, why)
    return path
