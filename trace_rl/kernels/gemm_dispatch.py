"""Which FP4 GEMM a dense `fp4_linear` runs at small M: the Gluon warp-specialised kernel (fp4_gemm_gluon.SMALL_M,
launched with programmatic dependent launch) or the Triton `fp4_matmul` (issue 15).

At M <= GLUON_MAX_M on an sm_90 GPU with Triton 3.6's Gluon, the Gluon GEMM is the faster kernel (H200,
benchmarks/gemm_ship_h200.sh); everywhere else (other GPUs, other Triton versions, larger M, a weight whose padded K
is not a whole number of its 512-column K steps, an explicit Triton `GemmConfig`) the Triton kernel runs. This is a
dispatch rule, not a fallback: `small_m_path` is a pure function of what it is given (tested on CPU), and the first
decision of each kind is logged once per process (`log_path`), so a run's log says which GEMM its small-M linears
take. `GLUON_SMALL_M = False` turns the Gluon path off.

Mid M (16 < M <= MID_M_LIMIT, below the dequantize + cuBLAS range; issue 15's M = 64 target): the Gluon GEMM at
`fp4_gemm_gluon_config.mid_m_config` (the wide token tile, or M64_GRID's per-shape pick, on the `fin` kernel: W4A4
row scale, bias, PDL as at small M) only for the weights GLUON_MID_M lists, up to the M it names: per format
{(padded N, padded K): max M}, filled from the H200's measurements (check `midm`, summary.json
`rule_proposal.GLUON_MID_M`: the largest M up to which the Gluon path beat the Triton one in every round). A weight
not listed, or M above its entry, takes the Triton `fp4_matmul` as before.
"""

from __future__ import annotations

import functools
import logging

from trace_rl.kernels.fp4_gemm_gluon_config import SMALL_M, GluonConfig, mid_m_config, small_m_fits

log = logging.getLogger("trace_rl.kernels")

GLUON_SMALL_M = True      # module switch: False sends every linear to the Triton fp4_matmul
GLUON_MAX_M = 16          # SMALL_M's token tiles (8 / 16): wider M takes the Triton kernel (or cuBLAS past it)
MID_M_LIMIT = 128         # the mid-M rule's range ends where fp4_dequant.DEQUANT_CUBLAS_MIN_M's cuBLAS path starts
# {format: {(padded N, padded K): the largest M (GLUON_MAX_M < M <= MID_M_LIMIT) the Gluon GEMM takes}}: measured
# only (check `midm`, H200 2026-12-03, benchmarks/results/midm_h200_1203a*.json: per weight, from M = 17 up, the
# largest M at which the Gluon GEMM beat the Triton fp4_matmul in every round at W4A16 AND W4A4; 1.04-1.5x there).
# Unlisted (nvfp4 4096x4096 / 4096x1024, mxfp4 4096x24576: Gluon lost at M = 17) take the Triton fp4_matmul.
GLUON_MID_M: dict[str, dict[tuple[int, int], int]] = {
    "nvfp4": {(12288, 4096): 128, (4096, 12288): 64, (6144, 4096): 128, (24576, 4096): 128},
    "mxfp4": {(12288, 4096): 128, (4096, 12288): 128, (6144, 4096): 128, (4096, 4096): 128, (1024, 4096): 96}}


def mid_m_max(fmt: str, n_padded: int | None, k_padded: int) -> int:
    """GLUON_MID_M's largest M for this weight (capped at MID_M_LIMIT), or GLUON_MAX_M where it has no entry."""
    return min(MID_M_LIMIT, (GLUON_MID_M.get(fmt) or {}).get((n_padded, k_padded), GLUON_MAX_M))


def mid_config(M: int, fmt: str, n_padded: int | None, k_padded: int) -> GluonConfig | None:
    """`mid_m_config` where M is in the weight's mid-M range (GLUON_MAX_M < M <= `mid_m_max`): the config the Gluon
    GEMM launches there if `small_m_path` sends the linear to it; else None. `fp4_linear` asks it once per call and
    hands it to both the rule (`small_m_path`'s K-step check) and the launch; never cached across calls
    (GLUON_MID_M and the config tables are module state that tests and benches patch)."""
    if not GLUON_MAX_M < M <= mid_m_max(fmt, n_padded, k_padded):
        return None
    return mid_m_config(M, fmt, n_padded, k_padded)


def small_m_path(M: int, fmt: str, k_padded: int, capability: tuple[int, int] | None, gluon: bool,
                 explicit_config: bool, enabled: bool = True, n_padded: int | None = None,
                 launch_config: GluonConfig | None = None) -> tuple[str, str]:
    """("gluon" | "triton", why) for a dense FP4 linear of M rows on a weight of format `fmt` whose Hopper layout
    is [`n_padded`, `k_padded`], on a device of compute `capability` (None: not CUDA), `gluon`: Triton 3.6's Gluon
    is importable, `explicit_config`: the caller passed a Triton GemmConfig, `enabled`: GLUON_SMALL_M. M <= 16: the
    small-M path; 16 < M <= GLUON_MID_M's entry for (n_padded, k_padded): the mid-M path (module doc), whose K step
    is `launch_config`'s (the caller's `mid_config` for this call: the config it will launch) or, None, that of
    `mid_m_config` asked here."""
    if not enabled:
        return "triton", "GLUON_SMALL_M is off"
    if explicit_config:
        return "triton", "an explicit Triton GemmConfig was given"
    mid, limit = M > GLUON_MAX_M, mid_m_max(fmt, n_padded, k_padded)
    if mid and M > limit:
        if (n_padded, k_padded) in (GLUON_MID_M.get(fmt) or {}):
            return "triton", f"M > {limit} (GLUON_MID_M's {fmt} {n_padded}x{k_padded})"
        return "triton", f"M > {GLUON_MAX_M}"
    if M < 1:
        return "triton", "no rows"
    if capability != (9, 0):
        return "triton", f"not an sm_90 GPU (capability {capability})"
    if not gluon:
        return "triton", "Triton 3.6's Gluon is not importable"
    if fmt not in ("nvfp4", "mxfp4"):
        return "triton", f"format {fmt}"
    if mid and launch_config is None:
        launch_config = mid_m_config(M, fmt, n_padded, k_padded)
    step = (launch_config if mid else SMALL_M).bk(fmt)
    fits = k_padded % step == 0 if mid else small_m_fits(k_padded, fmt)
    if not fits:
        return "triton", f"K pads to {k_padded}, not a multiple of the Gluon GEMM's {step}-column K step"
    if mid:
        return "gluon", (f"{GLUON_MAX_M} < M <= {limit} on sm_90 for {fmt} "
                         f"{n_padded}x{k_padded} (GLUON_MID_M): mid_m_config with programmatic dependent launch")
    return "gluon", f"M <= {GLUON_MAX_M} on sm_90: fp4_gemm_gluon.SMALL_M with programmatic dependent launch"


@functools.cache
def gluon_available() -> bool:
    """Triton 3.6 with its experimental Gluon API and the Gluon GEMM module importable (the launcher is pinned to
    3.6's API)."""
    import triton

    if not triton.__version__.startswith("3.6"):
        return False
    try:
        import trace_rl.kernels.fp4_gemm_gluon  # noqa: F401
    except Exception as e:   # noqa: BLE001 -- the rule's input: reported by `log_path`, not swallowed
        log.info("the Gluon FP4 GEMM is not importable: %r", e)
        return False
    return True


@functools.cache
def device_capability(index: int) -> tuple[int, int]:
    import torch

    return torch.cuda.get_device_capability(index)


_LOGGED: set = set()


def log_path(path: str, why: str) -> None:
    """logger.info once per process and (path, reason): which GEMM the small-M linears take."""
    key = (path, why)
    if key not in _LOGGED:
        _LOGGED.add(key)
        log.info("small-M FP4 linears (M <= %d, or a GLUON_MID_M weight up to its M) take the %s GEMM: %s",
                 GLUON_MAX_M, "Gluon" if path == "gluon" else "Triton fp4_matmul", why)


def dense_path(rows: int, device, fmt: str, k_padded: int, explicit_config: bool, n_padded: int | None = None,
               launch_config: GluonConfig | None = None) -> str:
    """`small_m_path` for a linear of `rows` rows on `device` (a torch.device) over an [n_padded, k_padded] layout
    (`launch_config`: as there), logged at M <= GLUON_MAX_M and where GLUON_MID_M sends it to Gluon; "gluon" or
    "triton"."""
    if rows > mid_m_max(fmt, n_padded, k_padded):     # no device query or log on the Triton / cuBLAS path
        return "triton"
    cap = None
    if device.type == "cuda":
        import torch

        cap = device_capability(device.index if device.index is not None else torch.cuda.current_device())
    gluon = cap == (9, 0) and GLUON_SMALL_M and gluon_available()
    path, why = small_m_path(rows, fmt, k_padded, cap, gluon, explicit_config, GLUON_SMALL_M, n_padded, launch_config)
    log_path(path, why)
    return path
