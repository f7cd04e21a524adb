"""`fp4_linear`: the fp4 backend's GPU linear (W4A16 or W4A4) on a `PackedWeight`, through the FP4 GEMM.

The GEMM reads the Hopper layout (hopper_fp4.py), derived from `packed.q` once and kept in
`packed.layout["hopper_fp4"]`; `PackedWeight.refresh_layouts()` (weight sync) re-derives it in place, so a
CUDA graph that captured the GEMM stays valid.

From `fp4_dequant.DEQUANT_CUBLAS_MIN_M` rows on (weights up to `DEQUANT_CUBLAS_MAX_WEIGHT` elements), both linears
dequantize the weight to a bf16 scratch and call cuBLAS instead (fp4_dequant.py: same math up to float32
accumulation order; `use_dequant_cublas(M, N, K)` says which). A weight with a persistent operand cache
(operand_cache.py, opt-in) takes cuBLAS on that cache instead from the same M on, whatever its size (same bits); an
mxfp4 weight with the FP8 cache (operand_cache_fp8.py) takes W4A4 activations as E4M3 there (`w4a4_e4m3`).

At M <= 16 on an sm_90 GPU with Triton 3.6 both take the Gluon GEMM (fp4_gemm_gluon.SMALL_M, programmatic dependent
launch; the rule: gemm_dispatch.py, `GLUON_SMALL_M` turns it off), and at 16 < M <= the weight's GLUON_MID_M entry
(measured shapes only) the Gluon GEMM at `mid_m_config` (the wide token tile on the same `fin` kernel), elsewhere the
Triton `fp4_matmul`. W4A4 there: the
activation quantize kernel issues griddepcontrol.launch_dependents at its start, so the GEMM's setup and weight
prefetch run under it; and inside a CUDA-graph capture (where the GEMM launches with PDL) the quantize is itself
launched with PDL (`QUANTIZE_PDL`, `w4a4_quantize_pdl`): its CTAs start under the previous kernel's tail and wait
(griddepcontrol.wait) before their first global access, which takes the separate quantize launch's fixed cost off
the small-M W4A4 linear (issue 15's o_proj and MLP misses at M <= 16). There the GEMM's config comes from
fp4_gemm_gluon_prefetch.W4A4_PDL_GRID where it lists the weight (`w4a4_pdl_gemm_config`: a ring deep enough to issue
all of a program's weight before its PDL wait, so the weight streams under the quantize); W4A16 keeps config_for's.

`fp4_grouped_linear` (mixture of experts) takes the Gluon grouped GEMM (fp4_grouped_gluon.py) or the Triton
`fp4_grouped_matmul` by grouped_dispatch.py's rule (`GLUON_GROUPED` turns the Gluon one off).
"""

from __future__ import annotations

import torch

from trace_rl.formats import per_token
from trace_rl.kernels import fp4_dequant
from trace_rl.kernels.fp4_dequant import dequant_matmul, use_dequant_cublas
from trace_rl.kernels.fp4_gemm import GemmConfig, fp4_matmul
from trace_rl.kernels.fp4_gemm_gluon_config import mid_m_config
from trace_rl.kernels.fp4_gemm_gluon_prefetch import w4a4_pdl_config
from trace_rl.kernels.gemm_dispatch import GLUON_MAX_M, dense_path, mid_config
from trace_rl.kernels.hopper_fp4 import LAYOUT_KEY, HopperFP4, padded_shape, to_hopper
from trace_rl.kernels.operand_cache import operand_cache_matmul, use_fp8_operand, use_operand_cache
from trace_rl.kernels.row_quantize import emits_e4m3, quantize_dequant_bf16, quantize_dequant_e4m3

# The W4A4 activation quantize before the small-M Gluon GEMM launched as a programmatic dependent of the kernel before
# it (row_quantize.launch_quantize_rows' `pdl_wait`); False: launched plainly (still signalling launch_dependents).
# Same bits either way (tests/kernels/test_w4a4_pdl_gpu.py); the time: check `w4a4pdl`.
QUANTIZE_PDL = True


def w4a4_quantize_pdl(path: str) -> bool:
    """Whether the W4A4 activation quantize before a dense GEMM on `path` ("gluon" / "triton", `small_m_gemm`) launches
    with PDL: `QUANTIZE_PDL`, the Gluon GEMM, and inside a CUDA-graph capture, i.e. exactly where that GEMM itself
    launches with PDL (`_dense_matmul`; in eager mode the kernel before could be a weight sync's, and eager decode
    is launch-bound). The quantize waits before any global access, so whatever kernel precedes it is safe."""
    return (QUANTIZE_PDL and path == "gluon" and torch.cuda.is_available()
            and torch.cuda.is_current_stream_capturing())


def w4a4_pdl_gemm_config(rows: int, packed, path: str):
    """The Gluon GEMM config of a W4A4 linear whose activations `fp4_linear` quantizes with its own PDL launch
    (`w4a4_quantize_pdl`): fp4_gemm_gluon_prefetch.W4A4_PDL_GRID's prefetch-all config for the weight's padded shape
    and M bucket (the weight stream under the quantize), or None (config_for's pick, as W4A16 runs it)."""
    if path != "gluon" or rows > GLUON_MAX_M or not w4a4_quantize_pdl(path):
        return None
    return w4a4_pdl_config(rows, packed.fmt, *padded_shape(packed.out_features, packed.in_features))


def w4a4_quantize_launch(path: str) -> dict:
    """The PDL keywords of the W4A4 activation quantize (`quantize_dequant_bf16`) before a dense GEMM on `path`:
    launch_dependents before the Gluon GEMM (its prologue under the quantize), pdl_wait where `w4a4_quantize_pdl`
    says. One place for the callers (`fp4_linear`, FP4Backend's shared-input quantizes)."""
    return {"launch_dependents": path == "gluon", "pdl_wait": w4a4_quantize_pdl(path)}


def derive_layout(q, out: HopperFP4 | None = None) -> HopperFP4:
    """The Hopper layout of `q`: the Triton kernel on CUDA tensors, the torch reference elsewhere."""
    if q.codes.is_cuda:
        from trace_rl.kernels.fp4_relayout import relayout

        return relayout(q, out)
    return to_hopper(q, out)


class _Layout(HopperFP4):
    """A HopperFP4 that `PackedWeight.refresh_layouts` re-derives in place from the new `q`."""

    def refresh_from(self, q) -> None:
        derive_layout(q, self)


def hopper_weight(packed) -> HopperFP4:
    """`packed.layout["hopper_fp4"]`, derived on first use."""
    h = packed.layout.get(LAYOUT_KEY)
    if h is None:
        if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
            raise RuntimeError("fp4_linear: the weight's Hopper layout would be derived inside a CUDA-graph capture "
                               "(and re-derived at every replay); run the layer once before capturing")
        q = packed.q
        experts = q.shape[0] if len(q.shape) == 3 else None
        h = _Layout.empty(q.format, *q.shape[-2:], q.codes.device, experts)
        derive_layout(q, h)
        packed.layout[LAYOUT_KEY] = h
    return h


def small_m_gemm(rows: int, device, packed, config=None, launch_config=None) -> str:
    """"gluon" or "triton": the GEMM a dense linear of `rows` rows on `device` takes below cuBLAS' range
    (gemm_dispatch: M <= 16, or a GLUON_MID_M weight up to its M; `launch_config`: `_mid_config`'s, if asked)."""
    n_padded, k_padded = padded_shape(packed.out_features, packed.in_features)
    return dense_path(rows, device, packed.fmt, k_padded, config is not None, n_padded, launch_config)


def _mid_config(rows: int, packed, config):
    """gemm_dispatch.mid_config for this call (None with an explicit Triton config, which takes the Triton GEMM):
    asked once per call, then handed to `small_m_gemm`'s rule and to `_dense_matmul`'s launch."""
    if config is not None:
        return None
    return mid_config(rows, packed.fmt, *padded_shape(packed.out_features, packed.in_features))


def w4a4_e4m3(x2: torch.Tensor, silu_mul: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """mxfp4 W4A4 rows as the FP8 operand cache takes them: (float8_e4m3fn [rows, K], float32 [rows] row scale) from
    the quantize kernel's E4M3 stores (`quantize_dequant_e4m3`), or for rows it does not take (> 16384 wide) its bf16
    operand converted by `operand_cache_fp8.rows_e4m3_reference` (the backend records fp4.operand_cache_fp8_cast)."""
    K = x2.shape[1] // 2 if silu_mul else x2.shape[1]
    if emits_e4m3(K, silu_mul):
        return quantize_dequant_e4m3(x2, silu_mul)
    from trace_rl.kernels.operand_cache_fp8 import rows_e4m3_reference

    return rows_e4m3_reference(quantize_dequant_bf16(x2, "mxfp4", silu_mul)[0])


def _dense_matmul(x2, packed, row_scale, bias, out_dtype, config, path: str | None = None, launch_config=None):
    """The FP4 GEMM, or at large M (and no explicit config) cuBLAS on the operand cache or dequantize + cuBLAS. At
    M <= 16 on sm_90, or a GLUON_MID_M weight up to its M (`small_m_gemm`; `path` and `launch_config`, the mid-M
    config it checked or the W4A4 PDL path's prefetch-all pick, if the caller already asked) the Gluon GEMM, launched
    as a programmatic dependent of the kernel before it (fp4_gemm_gluon_epilogue's contract: it reads x and the row
    scales, and writes, only after that kernel completes)."""
    if config is None and use_operand_cache(x2.shape[0], packed):
        return operand_cache_matmul(x2, packed, row_scale, bias, out_dtype)
    if x2.dtype == torch.float8_e4m3fn:
        raise ValueError(f"fp4_linear: E4M3 activations are for a weight's FP8 operand cache at >= "
                         f"{fp4_dequant.DEQUANT_CUBLAS_MIN_M} rows (config None); this call has {x2.shape[0]} rows, "
                         f"{'a config' if config is not None else 'no FP8 cache'}")
    if config is None and use_dequant_cublas(x2.shape[0], packed.out_features, packed.in_features):
        return dequant_matmul(x2, packed.q, hopper_weight(packed), row_scale, bias, out_dtype)
    if path is None:
        launch_config = _mid_config(x2.shape[0], packed, config)
        path = small_m_gemm(x2.shape[0], x2.device, packed, config, launch_config)
    if path == "gluon":
        from trace_rl.kernels.fp4_gemm_gluon import fp4_matmul_gluon

        h = hopper_weight(packed)
        # mid M (gemm_dispatch.GLUON_MID_M): the wide tile on the `fin` kernel (row scale, bias, PDL), the config the
        # rule checked (asked here only for a caller that named the path without it); M <= 16: config_for's small-M
        # pick (config None)
        gc = launch_config
        if gc is None and x2.shape[0] > GLUON_MAX_M:
            gc = mid_m_config(x2.shape[0], packed.fmt, *h.padded)
        # PDL only inside a CUDA-graph capture: there the node before the GEMM is the model's own kernel (a norm, a
        # quantize), never a weight writer; in eager mode the kernel before could be a weight sync's in-place layout
        # refresh, whose writes the GEMM's pre-wait weight prefetch would race (and eager decode is launch-bound:
        # the overlap buys nothing there).
        return fp4_matmul_gluon(x2, h, gc, row_scale=row_scale, bias=bias, out_dtype=out_dtype,
                                pdl=torch.cuda.is_current_stream_capturing())
    return fp4_matmul(x2, hopper_weight(packed), row_scale, bias, out_dtype=out_dtype, config=config)


def _check(packed, act_fmt: str, K: int) -> None:
    if packed.fmt not in ("nvfp4", "mxfp4") or packed.q is None:
        raise ValueError(f"fp4_linear takes an nvfp4 or mxfp4 PackedWeight, got format {packed.fmt!r}")
    if act_fmt not in ("bf16", packed.fmt):
        raise ValueError(f"fp4_linear: activations in {act_fmt!r} with {packed.fmt!r} weights is not supported; "
                         f"use 'bf16' (W4A16) or {packed.fmt!r} (W4A4)")
    if K != packed.in_features:
        raise ValueError(f"fp4_linear: x has {K} features, the weight expects {packed.in_features}")


def fp4_linear(x: torch.Tensor, packed, act_fmt: str = "bf16", bias: torch.Tensor | None = None,
               config: GemmConfig | None = None) -> torch.Tensor:
    """y [..., N] = act(x) @ dequant(W)^T + bias in x.dtype. act_fmt "bf16" (W4A16) or packed.fmt (W4A4:
    x quantized per token to `per_token(packed.fmt)`, i.e. nvfp4:row or mxfp4, by the quantize kernel)."""
    K = x.shape[-1]
    _check(packed, act_fmt, K)
    lead = x.shape[:-1]
    x2 = x.reshape(-1, K)
    if x2.shape[0] == 0:
        return x.new_empty(*lead, packed.out_features)
    row_scale = None
    gc = _mid_config(x2.shape[0], packed, config)     # asked once: the rule's K-step check and the launch
    path = small_m_gemm(x2.shape[0], x2.device, packed, config, gc)
    if config is None and use_fp8_operand(x2.shape[0], packed):
        if act_fmt == "bf16":
            raise ValueError("fp4_linear: an FP8 operand cache multiplies W4A4 mxfp4 activations (E4M3 exactly); "
                             "W4A16 bf16 activations are not E4M3 values: use the bf16 operand cache for W4A16 plans")
        xb, row_scale = w4a4_e4m3(x2 if x2.stride(-1) == 1 else x2.contiguous())
        return _dense_matmul(xb, packed, row_scale, bias, x.dtype, config, path, gc).reshape(*lead,
                                                                                             packed.out_features)
    if act_fmt == "bf16":
        xb = x2.to(torch.bfloat16)
        xb = xb if xb.stride(-1) == 1 else xb.contiguous()
    else:   # before the Gluon GEMM the quantize kernel lets it launch early (PDL): its prologue under the quantize;
        # in a capture the quantize is a PDL launch too (its start under the kernel before it)
        xb, row_scale = quantize_dequant_bf16(x2 if x2.stride(-1) == 1 else x2.contiguous(), per_token(act_fmt),
                                              **w4a4_quantize_launch(path))
        # the quantize is this GEMM's PDL predecessor: a prefetch-all config (where measured) streams the weight
        # under it (fp4_gemm_gluon_prefetch; W4A16 and eager calls keep config_for's pick)
        gc = (w4a4_pdl_gemm_config(x2.shape[0], packed, path) if config is None else None) or gc
    y = _dense_matmul(xb, packed, row_scale, bias, x.dtype, config, path, gc)
    return y.reshape(*lead, packed.out_features)


def fp4_linear_prequantized(xq: torch.Tensor, row_scale: torch.Tensor | None, packed,
                            bias: torch.Tensor | None = None, out_dtype: torch.dtype = torch.bfloat16,
                            config: GemmConfig | None = None) -> torch.Tensor:
    """W4A4 with activations already quantized by a fused producer (RMSNorm, SiLU x mul epilogues):
    `xq` [..., K] bf16 holds code value x block scale of `per_token(packed.fmt)` (exact in bf16), `row_scale`
    [...] float32 the nvfp4:row global scale per token (None for mxfp4); or, for a weight reading its FP8 operand
    cache at this M, `w4a4_e4m3`'s E4M3 rows and row scale. Same result as `fp4_linear(x, packed, packed.fmt)` on
    the x those came from (up to float32 accumulation order for E4M3); no quantization launch."""
    K = xq.shape[-1]
    _check(packed, packed.fmt, K)
    e4m3 = xq.dtype == torch.float8_e4m3fn
    if xq.dtype != torch.bfloat16 and not e4m3:
        raise ValueError(f"fp4_linear_prequantized: xq must be bfloat16 (code x block scale) or float8_e4m3fn (the "
                         f"FP8 operand cache's rows), got {xq.dtype}")
    if e4m3 != (config is None and use_fp8_operand(xq.numel() // K if K else 0, packed)):
        raise ValueError(f"fp4_linear_prequantized: {xq.dtype} activations for a weight that "
                         f"{'does not read' if e4m3 else 'reads'} its FP8 operand cache at these rows; quantize with "
                         f"{'quantize_dequant_bf16' if e4m3 else 'w4a4_e4m3'}")
    if e4m3 and row_scale is None:
        raise ValueError("fp4_linear_prequantized: E4M3 activations need their row scale (w4a4_e4m3)")
    if (row_scale is None) != (packed.fmt == "mxfp4") and not e4m3:
        raise ValueError(f"fp4_linear_prequantized: {packed.fmt} activations "
                         f"{'have no' if packed.fmt == 'mxfp4' else 'need a'} per-token global scale")
    lead = xq.shape[:-1]
    x2 = xq.reshape(-1, K)
    x2 = x2 if x2.stride(-1) == 1 else x2.contiguous()
    rs = None if row_scale is None else row_scale.reshape(-1).float()
    y = _dense_matmul(x2, packed, rs, bias, out_dtype, config)
    return y.reshape(*lead, packed.out_features)


def fp4_grouped_linear(x_sorted: torch.Tensor, expert_offsets: torch.Tensor, experts, act_fmt: str = "bf16",
                       bias: torch.Tensor | None = None, config: GemmConfig | None = None,
                       fuse_act_quant: bool | None = None, src_rows: torch.Tensor | None = None,
                       silu_mul: bool = False, src_padded: bool = True, path: str | None = None) -> torch.Tensor:
    """Mixture-of-experts linear in one launch: rows of `x_sorted` [R, K] (tokens sorted by expert; a token
    routed to k experts appears k times) offsets[e] <= r < offsets[e + 1] go through expert e of `experts`
    (a PackedWeight with q [E, N, K], `backends.fp4.prepare_expert_weights`). `expert_offsets` int32 [E + 1]
    on the device. W4A16 (act_fmt "bf16") or W4A4 (act_fmt == experts.fmt, tokens quantized per row).
    Rows >= offsets[E] come back as zeros. Returns [R, N] in x's dtype; `bias` [E, N] or None.
    W4A4: `fuse_act_quant` quantizes the activations inside the grouped kernel (one launch) instead of a
    separate quantize launch; same codes and scales either way. None: `fp4_grouped.FUSE_ACT_QUANT`.
    Producers of the rows, same result as running them first:
    - `src_rows` [R] int64: `x_sorted` holds the tokens [T, K] and row r is token src_rows[r] (T: a zero row),
      i.e. `models.grouped.gather_rows` (Permutation.token_of_row; `src_padded` False: no index is T, which
      saves appending the zero row). W4A4 quantizes the T tokens once, then
      gathers the quantized rows and their scales (per-token quantization: the same codes as quantizing the
      gathered rows, at 1/k of the quantize work for top-k routing);
    - `silu_mul`: `x_sorted` is [R, 2K] (gate | up) and the rows are SiLU(gate) * up (`swiglu.silu_mul`),
      fused into the W4A4 quantize launch.
    The GEMM: the Gluon grouped kernel or the Triton one by `grouped_gemm_path` (kernels.grouped_dispatch's rule;
    `path` if the caller already asked, as `GroupedQuantLinear` does to record it)."""
    from trace_rl.kernels.fp4_grouped import FUSE_ACT_QUANT

    if experts.q is None or len(experts.q.shape) != 3:
        raise ValueError("fp4_grouped_linear: `experts` must hold [E, N, K] weights "
                         "(backends.fp4.prepare_expert_weights)")
    if src_rows is not None and silu_mul:
        raise ValueError("fp4_grouped_linear: src_rows (the permute) and silu_mul (the SwiGLU) are different "
                         "producers; pass one")
    K = x_sorted.shape[-1] // 2 if silu_mul else x_sorted.shape[-1]
    _check(experts, act_fmt, K)
    fuse = FUSE_ACT_QUANT if fuse_act_quant is None else fuse_act_quant
    rows = x_sorted.shape[0] if src_rows is None else src_rows.shape[0]
    path = path or grouped_gemm_path(rows, x_sorted.device, experts, act_fmt, fuse, config, bias)
    if path == "gluon" and act_fmt != "bf16" and fuse:
        raise ValueError("fp4_grouped_linear: the Gluon grouped GEMM takes prequantized W4A4 rows; pass "
                         "fuse_act_quant=False or path None")
    if act_fmt != "bf16" and not fuse:     # the quantize launch, producers fused in
        xb, row_scale = quantize_dequant_bf16(x_sorted.contiguous(), per_token(act_fmt), silu_mul)
        if src_rows is not None and src_padded:   # zero padding row: codes 0, row scale 1 (= quantizing zeros)
            xb = torch.cat([xb, xb.new_zeros(1, K)])
            row_scale = None if row_scale is None else torch.cat([row_scale, row_scale.new_ones(1)])
        if src_rows is not None:
            xb, row_scale = xb[src_rows], None if row_scale is None else row_scale[src_rows]
        return _grouped_matmul(path, xb, expert_offsets, experts, row_scale, bias, x_sorted.dtype, config)
    if src_rows is not None:
        x_sorted = (torch.cat([x_sorted, x_sorted.new_zeros(1, K)]) if src_padded else x_sorted)[src_rows]
    elif silu_mul:
        from trace_rl.kernels.swiglu import silu_mul as _silu_mul

        x_sorted = _silu_mul(x_sorted)
    xb = x_sorted.to(torch.bfloat16)
    xb = xb if xb.stride(-1) == 1 else xb.contiguous()
    act_quant = None if act_fmt == "bf16" else per_token(act_fmt)   # W4A4 quantized in the grouped kernel
    return _grouped_matmul(path, xb, expert_offsets, experts, None, bias, x_sorted.dtype, config, act_quant)


def grouped_gemm_path(rows: int, device, experts, act_fmt: str = "bf16", fuse_act_quant: bool = False,
                      config: GemmConfig | None = None, bias: torch.Tensor | None = None) -> str:
    """"gluon" or "triton": the grouped GEMM `fp4_grouped_linear` runs for `rows` buffer rows on `device`
    (kernels.grouped_dispatch.grouped_gemm, logged)."""
    from trace_rl.kernels.grouped_dispatch import grouped_gemm

    E, N, K = experts.q.shape
    bias_ok = bias is None or (bias.shape == (E, N) and bias.is_contiguous())
    return grouped_gemm(rows, device, experts.fmt, padded_shape(N, K)[1], E, config is not None,
                        act_fmt != "bf16" and fuse_act_quant, bias_ok)


def _grouped_matmul(path: str, xb, offsets, experts, row_scale, bias, out_dtype, config, act_quant=None):
    """The grouped GEMM of `path` over the experts' stacked Hopper layout; rows >= offsets[E] zeroed."""
    if path == "gluon":
        from trace_rl.kernels.fp4_grouped_gluon import fp4_grouped_matmul_gluon

        return fp4_grouped_matmul_gluon(xb, offsets, hopper_weight(experts), row_scale, bias, out_dtype,
                                        zero_tail=True)
    if path != "triton":
        raise ValueError(f"fp4_grouped_linear: path {path!r}; known: gluon, triton")
    from trace_rl.kernels.fp4_grouped import fp4_grouped_matmul

    return fp4_grouped_matmul(xb, offsets, hopper_weight(experts), row_scale, bias, out_dtype, config,
                              act_quant=act_quant, zero_tail=True)
