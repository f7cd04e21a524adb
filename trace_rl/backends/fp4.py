"""fp4 backend: NVFP4/MXFP4 weights (W4A16) and activations (W4A4).

Paths (reported in `paths`, never silent):
- `fp4.emulated`: CPU (or a GPU without the kernels). The weight is dequantized once (cached), the
  activations are quantize-dequantized per token in torch, and the matmul runs in float32. Numerically
  this is the format's reference: E2M1 x E4M3 products are exact, only accumulation order differs.
- `fp4.triton`: CUDA tensors with trace_rl.kernels available: the FP4 GEMM (packed 4-bit weights
  dequantized in registers, W4A4 activations quantized per token by the quantize kernel), and weight
  quantization by the quantize kernel (bit-exact with the reference, so no behaviour change).
- `fp4.sync.fused` / `fp4.sync.requantize` (weight sync, `QuantLinear.load_weight` / `GroupedQuantLinear.load_weight`):
  with CUDA tensors, the kernels, and the Hopper layout already derived (the layer ran, or `derive_kernel_layout`),
  `quantize_into` writes the codes, scales and layout in one pass (`kernels.quantize_relayout`) into the buffers in
  place; else the weight is quantized (`prepare_weight`), copied in, and the layouts re-derived.
- `fp4.gluon`: the same at M <= 16 on an sm_90 GPU with Triton 3.6's Gluon (`kernels.gemm_dispatch`): the Gluon
  warp-specialised FP4 GEMM (`kernels.fp4_gemm_gluon.SMALL_M`, programmatic dependent launch) instead of the Triton
  one, and at 16 < M <= a weight's `gemm_dispatch.GLUON_MID_M` entry (measured shapes) its wide tiles
  (`mid_m_config`); `kernels.gemm_dispatch.GLUON_SMALL_M = False` turns it off.
- `fp4.dequant_cublas`: the same on CUDA at M >= `kernels.fp4_dequant.DEQUANT_CUBLAS_MIN_M` rows over weights of
  at most `DEQUANT_CUBLAS_MAX_WEIGHT` elements (`use_dequant_cublas(M, N, K)`): the weight
  dequantized to a bf16 scratch, one cuBLAS GEMM (float32 output), the FP4 GEMM's epilogue
  (TRACE_RL_FP4_DEQUANT_CUBLAS=0 disables it).
- `fp4.operand_cache_cublas`: a dense weight holding a persistent operand cache (`kernels.operand_cache`, opt-in:
  `NativeEngine(operand_cache=True)`), from the same M on and for every weight size: cuBLAS on the cached bf16
  operand (refreshed in place at every weight sync) + the same epilogue, the dequant path's bits without its
  per-call dequantization.
- `fp4.operand_stack_cublas`: layers sharing a W4A4 input (q/k/v, gate/up of an nvfp4 model) whose operand caches
  the engine stacked (`kernels.operand_cache.attach_stacked`), from the same M on: one cuBLAS GEMM + epilogue over
  the stack (`linear_stacked`; per-row factors keep each part's global scale), not one per layer. The same operand
  and activation bits and the same rounding; only cuBLAS's float32 accumulation order may differ (another N).
- `fp4.silu_mul_quantize`: the MLP's SiLU(gate) * up and the down projection's W4A4 input quantization in one
  launch (`quantize_silu_mul_input`, `models.linear.silu_mul_linear`: where the stacked gate/up GEMM gives gate | up
  as one buffer), instead of torch's SiLU, its multiply and the quantize launch; the same bits (exact SiLU).
- `fp4.operand_stack_silu_mul_quantize`: that gate/up stacked GEMM's FP4 epilogue fused into the SiLU x mul quantize
  (`linear_stacked_silu_mul_quantize`: cuBLAS's float32 accumulator read by the quantize kernel, the epilogue's
  math applied there; the same bits as the two launches, the bf16 gate | up never written).
- `fp4.operand_cache_fp8`: an mxfp4 weight holding the FP8 operand cache (`kernels.operand_cache_fp8`, opt-in:
  `NativeEngine(operand_cache="fp8")`), from the same M on, W4A4: the activations' producer (quantize, norm +
  quantize, SiLU x mul + quantize) stores E4M3 rows and a power-of-two row scale in the same launch, and
  `torch._scaled_mm` (float32 output) + the same epilogue replace the bf16 cuBLAS GEMM: the same operand values
  (checked exact at every weight sync; activation blocks > 14 binades below their row's largest round), FP8 tensor
  cores. `fp4.operand_cache_fp8_cast`: bf16 W4A4 rows reached such a weight (rows > 16384 wide, a stacked epilogue's
  output): converted to E4M3 by torch ops (`operand_cache_fp8.rows_e4m3_reference`), extra launches.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from trace_rl.backends.base import Availability, Backend, PackedWeight, default_device
from trace_rl.backends.registry import register_backend
from trace_rl.formats import QTensor, get_format, per_token


def _check_act(act_fmt: str, packed: PackedWeight) -> None:
    if act_fmt not in ("bf16", packed.fmt):
        raise ValueError(f"fp4 backend: activations in {act_fmt!r} with {packed.fmt!r} weights is not a "
                         f"supported combination; use 'bf16' (W4A16) or {packed.fmt!r} (W4A4)")


def emulated_linear(x: torch.Tensor, packed: PackedWeight, act_fmt: str, bias: torch.Tensor | None):
    """Reference W4A16/W4A4 linear in float32: quantize-dequantize, then matmul.

    float64 inputs compute in float64 (the dequantized values are exact in both), so that CPU tests can
    compare this path with the trainer's fake quantization without float32 noise crossing a rounding
    boundary."""
    compute = torch.float64 if x.dtype == torch.float64 else torch.float32
    xf = x.to(compute)
    if act_fmt != "bf16":
        xf = get_format(per_token(act_fmt)).fake_quantize(xf)
    y = xf @ packed.dequantized().to(compute).T
    if bias is not None:
        y = y + bias.to(compute)
    return y.to(x.dtype)


def prepare_expert_weights(weight: torch.Tensor, fmt: str) -> PackedWeight:
    """Mixture-of-experts weights [E, N, K] -> one PackedWeight with q [E, N, K]: each expert quantized on
    its own (nvfp4: one global scale per expert, stored [E, 1, 1]), by the quantize kernel on CUDA tensors
    (bit-exact with the reference). For `kernels.fp4_grouped_linear` and `grouped_linear_reference`."""
    if weight.dim() != 3:
        raise ValueError(f"prepare_expert_weights takes [E, N, K] weights, got shape {tuple(weight.shape)}")
    if fmt not in ("nvfp4", "mxfp4"):
        raise ValueError(f"prepare_expert_weights: format {fmt!r} is not an FP4 weight format (nvfp4, mxfp4)")
    e, n, k = weight.shape
    if weight.is_cuda and _kernels_available()[0]:
        from trace_rl.kernels import quantize
    else:
        quantize = lambda w, f: get_format(f).quantize(w)  # noqa: E731
    qs = [quantize(weight[i].detach(), fmt) for i in range(e)]
    glob = torch.stack([q.global_scale.reshape(()) for q in qs]).reshape(e, 1, 1) if fmt == "nvfp4" else None
    q = QTensor(torch.stack([q.codes for q in qs]), torch.stack([q.scales for q in qs]), glob, (e, n, k),
                weight.dtype, fmt)
    return PackedWeight(fmt, n, k, q=q)


def grouped_linear_reference(x_sorted: torch.Tensor, expert_offsets: torch.Tensor, experts: PackedWeight,
                             act_fmt: str = "bf16", bias: torch.Tensor | None = None) -> torch.Tensor:
    """Torch reference of `kernels.fp4_grouped_linear` (float32 math, emulated quantization; any device)."""
    _check_act(act_fmt, experts)
    offs = expert_offsets.tolist()
    w = experts.dequantized()
    out = torch.zeros(x_sorted.shape[0], experts.out_features, dtype=x_sorted.dtype, device=x_sorted.device)
    for e in range(len(offs) - 1):
        lo, hi = offs[e], offs[e + 1]
        if hi > lo:
            xe = x_sorted[lo:hi].float()
            if act_fmt != "bf16":
                xe = get_format(per_token(act_fmt)).fake_quantize(xe)
            ye = xe @ w[e].float().T
            out[lo:hi] = (ye if bias is None else ye + bias[e].float()).to(out.dtype)
    return out


@register_backend("fp4")
class FP4Backend(Backend):
    weight_formats = ("nvfp4", "mxfp4")

    def available(self, device=None) -> Availability:
        device = torch.device(device) if device is not None else default_device()
        if device.type != "cuda":
            return Availability(True, "fp4.emulated",
                                "no GPU: FP4 is emulated (quantize -> dequantize -> float32 matmul in torch)")
        ok, why = _kernels_available()
        if ok:
            return Availability(True, "fp4.triton")
        return Availability(True, "fp4.emulated", f"the Triton FP4 kernels cannot run ({why}); FP4 is emulated")

    def prepare_weight(self, weight: torch.Tensor, fmt: str) -> PackedWeight:
        if not (weight.is_cuda and _kernels_available()[0]):
            return super().prepare_weight(weight, fmt)
        from trace_rl.kernels import quantize

        self.check_format(fmt)
        n, k = weight.shape
        return PackedWeight(fmt, n, k, q=quantize(weight.detach(), fmt))

    def fused_sync_runs(self, weight: torch.Tensor) -> bool:
        """`quantize_into`'s kernel runs on `weight` (CUDA with the kernels; tests patch this to run the kernel in the
        interpreter on CPU tensors)."""
        return weight.is_cuda and _kernels_available()[0]

    def fused_sync_ready(self, weight: torch.Tensor, packed: PackedWeight) -> bool:
        """`quantize_into` will take the fused path for this weight and packed weight."""
        from trace_rl.kernels.hopper_fp4 import LAYOUT_KEY  # no Triton in it (it may be absent)

        q = packed.q
        h = packed.layout.get(LAYOUT_KEY)
        if packed.fmt not in self.weight_formats or q is None or h is None:
            return False
        experts = len(q.shape) == 3
        glob_ok = q.global_scale is None or q.global_scale.numel() == (q.shape[0] if experts else 1)
        return glob_ok and h.values.dim() == (3 if experts else 2) and self.fused_sync_runs(weight)

    def quantize_into(self, weight: torch.Tensor, packed: PackedWeight,
                      amax_bits: torch.Tensor | None = None) -> tuple[str, ...]:
        """nvfp4 / mxfp4 `packed` ([N, K], or stacked experts [E, N, K] with one global scale per expert) holding its
        Hopper layout: `quantize_relayout` writes q's codes, scales, global scale and the layout in one pass, in
        place (same bits as quantize + copy + re-derive; captured CUDA graphs keep reading the same tensors).
        `amax_bits`: a dense nvfp4 weight's tensor amax computed ahead (`quant_linear.load_linear_weights`)."""
        if not self.fused_sync_ready(weight, packed):
            self.paths.record("fp4.sync.requantize")
            return ()
        from trace_rl.kernels.hopper_fp4 import LAYOUT_KEY, HopperFP4, expert_q
        from trace_rl.kernels.quantize_relayout import quantize_relayout

        q, h = packed.q, packed.layout[LAYOUT_KEY]
        experts = len(q.shape) == 3
        w = weight.detach().to(q.codes.device)
        if not experts:
            quantize_relayout(w, packed.fmt, out=h, q=q, amax_bits=amax_bits)
        else:   # expert by expert into views of the stacked buffers and layout
            amax = None
            if packed.fmt == "nvfp4":   # every expert's tensor amax in one launch, not one launch per expert
                from trace_rl.kernels.weight_quantize import weights_amax_bits, weights_amax_ok

                ws = list(w)
                amax = weights_amax_bits(ws) if weights_amax_ok(ws) else None
            for e in range(q.shape[0]):
                quantize_relayout(w[e], packed.fmt, q=expert_q(q, e),
                                  out=HopperFP4(h.fmt, h.n, h.k, h.values[e], h.scales[e], h.row_factor[e]),
                                  amax_bits=None if amax is None else amax[e:e + 1])
        self.paths.record("fp4.sync.fused")
        return (LAYOUT_KEY,)

    def linear(self, x, packed, act_fmt="bf16", bias=None):
        _check_act(act_fmt, packed)
        if _on_kernels(x):
            from trace_rl.kernels import fp4_linear

            rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
            if act_fmt != "bf16" and self._fp8_rows(rows, packed):
                from trace_rl.kernels.row_quantize import emits_e4m3

                if not emits_e4m3(x.shape[-1]):
                    self.paths.record("fp4.operand_cache_fp8_cast")
            self._record_dense(rows, packed, x.device)
            return fp4_linear(x, packed, act_fmt, bias)
        self.paths.record("fp4.emulated")
        return emulated_linear(x, packed, act_fmt, bias)

    def _record_dense(self, rows: int, packed, device) -> None:
        """The path a dense linear of `rows` rows takes on the kernels (the choice `kernels.linear` makes)."""
        from trace_rl.kernels.fp4_dequant import use_dequant_cublas
        from trace_rl.kernels.linear import small_m_gemm
        from trace_rl.kernels.operand_cache import use_fp8_operand, use_operand_cache

        if use_fp8_operand(rows, packed):
            self.paths.record("fp4.operand_cache_fp8")
        elif use_operand_cache(rows, packed):
            self.paths.record("fp4.operand_cache_cublas")
        elif use_dequant_cublas(rows, packed.out_features, packed.in_features):
            self.paths.record("fp4.dequant_cublas")
        else:
            self.paths.record("fp4.gluon" if small_m_gemm(rows, device, packed) == "gluon" else "fp4.triton")

    def _fp8_rows(self, rows: int, packed) -> bool:
        """Whether W4A4 rows for `packed` go to its FP8 operand cache (E4M3 stores in the producer)."""
        from trace_rl.kernels.operand_cache import use_fp8_operand

        return use_fp8_operand(rows, packed)

    def _e4m3(self, x2, silu_mul: bool = False):
        """`kernels.linear.w4a4_e4m3`, recording the torch conversion where the quantize kernel cannot store E4M3."""
        from trace_rl.kernels.linear import w4a4_e4m3
        from trace_rl.kernels.row_quantize import emits_e4m3

        if not emits_e4m3(x2.shape[1] // 2 if silu_mul else x2.shape[1], silu_mul):
            self.paths.record("fp4.operand_cache_fp8_cast")
        return w4a4_e4m3(x2, silu_mul)

    def quantize_input(self, x, packed, act_fmt):
        """W4A4 `x` quantized per token once for the layers sharing it (`SharedInput`; models.linear.shared_input):
        on the kernels the quantize kernel's bf16 operand and row scale `fp4_linear` would compute, emulated the
        float32 quantize-dequantize `emulated_linear` would. None for W4A16 and for no rows."""
        _check_act(act_fmt, packed)
        K = x.shape[-1]
        if act_fmt == "bf16" or x.numel() == 0:
            return None
        if _on_kernels(x):
            from trace_rl.kernels.linear import small_m_gemm, w4a4_quantize_launch
            from trace_rl.kernels.row_quantize import quantize_dequant_bf16

            x2 = x.reshape(-1, K)
            if self._fp8_rows(x2.shape[0], packed):
                xq, row_scale = self._e4m3(x2 if x2.stride(-1) == 1 else x2.contiguous())
                return SharedInput(act_fmt, x.shape, x.dtype, xq, row_scale, kernels=True)
            # the first layer sharing the input follows at once: a small-M Gluon GEMM may start under the quantize
            # (and in a capture the quantize starts under the kernel before it: kernels.linear.w4a4_quantize_pdl)
            path = small_m_gemm(x2.shape[0], x2.device, packed)
            xq, row_scale = quantize_dequant_bf16(x2 if x2.stride(-1) == 1 else x2.contiguous(), per_token(act_fmt),
                                                  **w4a4_quantize_launch(path))
            return SharedInput(act_fmt, x.shape, x.dtype, xq, row_scale, kernels=True)
        compute = torch.float64 if x.dtype == torch.float64 else torch.float32
        xf = get_format(per_token(act_fmt)).fake_quantize(x.to(compute))
        return SharedInput(act_fmt, x.shape, x.dtype, xf, None, kernels=False)

    def quantize_silu_mul_input(self, gate_up, packed, act_fmt):
        """`quantize_input(F.silu(gate) * up, packed, act_fmt)` from gate_up [..., 2K] (gate | up) in one launch
        (the W4A4 quantize kernel's SILU_MUL operand), the same bits as the SiLU, the multiply and the quantize
        apart (with `kernels.swiglu.EXACT_SILU`: torch's CUDA SiLU). None for W4A16, no rows, off the kernels, or
        with EXACT_SILU off (the fast form is not torch's bits): the caller runs them apart."""
        _check_act(act_fmt, packed)
        K2 = gate_up.shape[-1]
        if act_fmt == "bf16" or gate_up.numel() == 0 or K2 % 2 or not _on_kernels(gate_up):
            return None
        from trace_rl.kernels import swiglu
        from trace_rl.kernels.linear import small_m_gemm, w4a4_quantize_launch
        from trace_rl.kernels.row_quantize import quantize_dequant_bf16

        if not swiglu.EXACT_SILU:
            return None
        x2 = gate_up.reshape(-1, K2)
        if self._fp8_rows(x2.shape[0], packed):
            xq, row_scale = self._e4m3(x2 if x2.stride(-1) == 1 else x2.contiguous(), silu_mul=True)
            self.paths.record("fp4.silu_mul_quantize")
            return SharedInput(act_fmt, torch.Size((*gate_up.shape[:-1], K2 // 2)), gate_up.dtype, xq, row_scale,
                               kernels=True)
        path = small_m_gemm(x2.shape[0], x2.device, packed)    # the down projection follows at once (as above)
        xq, row_scale = quantize_dequant_bf16(x2 if x2.stride(-1) == 1 else x2.contiguous(), per_token(act_fmt),
                                              silu_mul=True, **w4a4_quantize_launch(path))
        self.paths.record("fp4.silu_mul_quantize")
        return SharedInput(act_fmt, torch.Size((*gate_up.shape[:-1], K2 // 2)), gate_up.dtype, xq, row_scale,
                           kernels=True)

    def norm_quantize_input(self, x, residual, norm_weight, eps, packed, act_fmt, keep_h=True):
        """On the kernels, one launch for the residual add + RMSNorm and the W4A4 quantization of its output
        (`kernels.rmsnorm_quantize.add_rms_norm_quantize`: the bits of `add_rms_norm` then the quantize kernel).
        None for W4A16, no rows, off the kernels (CPU emulation) and rows the one-tile kernel does not take."""
        _check_act(act_fmt, packed)
        if act_fmt == "bf16" or x.numel() == 0 or not _on_kernels(x):
            return None
        from trace_rl.kernels.rmsnorm_quantize import add_rms_norm_quantize, fuses

        fmt = per_token(act_fmt)
        if not fuses(x.shape[-1], fmt):
            return None
        rows = x.numel() // x.shape[-1]
        h, r, xq, row_scale = add_rms_norm_quantize(x, residual, norm_weight, eps, fmt, store_h=keep_h,
                                                    e4m3=self._fp8_rows(rows, packed))
        self.paths.record("fp4.norm_quantize")
        return h, r, SharedInput(act_fmt, x.shape, x.dtype, xq, row_scale, kernels=True)

    def linear_quantized(self, xq, packed, bias=None):
        _check_act(xq.act_fmt, packed)
        if xq.kernels:
            from trace_rl.kernels import fp4_linear_prequantized
            from trace_rl.kernels.operand_cache import use_fp8_operand

            x, row_scale = xq.x, xq.row_scale
            if x.dtype == torch.bfloat16 and use_fp8_operand(x.shape[0], packed):   # a producer that stores bf16
                from trace_rl.kernels.operand_cache_fp8 import rows_e4m3_reference

                self.paths.record("fp4.operand_cache_fp8_cast")
                x, row_scale = rows_e4m3_reference(x)
            self._record_dense(x.shape[0], packed, x.device)
            y = fp4_linear_prequantized(x, row_scale, packed, bias, xq.dtype)
            return y.reshape(*xq.shape[:-1], packed.out_features)
        self.paths.record("fp4.emulated")
        y = xq.x @ packed.dequantized().to(xq.x.dtype).T          # emulated_linear after its quantization
        if bias is not None:
            y = y + bias.to(xq.x.dtype)
        return y.to(xq.dtype)

    def linear_stacked(self, xq, packeds, biases=None):
        """One GEMM for the parts (the base class's doc) when they are one stacked operand cache, in order, with
        no bias, and the rows reach the cache's threshold: [..., sum N] with the parts' outputs side by side, each
        part's columns as `linear_quantized` computes them up to float32 accumulation order. None otherwise."""
        if not xq.kernels or any(b is not None for b in biases or ()) or xq.x.dtype != torch.bfloat16:
            return None         # E4M3 rows: FP8 caches, never stacked
        from trace_rl.kernels.operand_cache import stacked, stacked_matmul, use_operand_cache

        st = stacked(packeds)
        if st is None or not use_operand_cache(xq.x.shape[0], packeds[0]):
            return None
        for p in packeds:
            _check_act(xq.act_fmt, p)
        self.paths.record("fp4.operand_stack_cublas")
        y = stacked_matmul(xq.x, st, xq.row_scale, xq.dtype)
        return y.reshape(*xq.shape[:-1], st.n)

    def linear_stacked_silu_mul_quantize(self, xq, packeds, down, act_fmt):
        """On the kernels, gate | up one stacked operand cache at a row count that reads it, bf16, no bias (the
        stack has none), the exact SiLU and rows the one-row tile takes: cuBLAS, then one launch for the FP4
        epilogue, SiLU x mul and `down`'s W4A4 quantize (`kernels.operand_cache.stacked_silu_mul_quantize`, the bits
        of `linear_stacked` then `quantize_silu_mul_input`). None otherwise, before any work."""
        _check_act(act_fmt, down)
        if (not xq.kernels or act_fmt == "bf16" or xq.dtype != torch.bfloat16 or len(packeds) != 2
                or xq.x.dtype != torch.bfloat16):
            return None
        from trace_rl.kernels import swiglu
        from trace_rl.kernels.epilogue_silu_quantize import fuses
        from trace_rl.kernels.operand_cache import stacked, stacked_silu_mul_quantize, use_operand_cache

        st = stacked(packeds)
        k = down.in_features
        if (st is None or not use_operand_cache(xq.x.shape[0], packeds[0]) or st.sizes != (k, k)
                or not swiglu.EXACT_SILU or not fuses(k, per_token(act_fmt))):
            return None
        for p in packeds:
            _check_act(xq.act_fmt, p)
        self.paths.record("fp4.operand_stack_silu_mul_quantize")
        x, row_scale = stacked_silu_mul_quantize(xq.x, st, xq.row_scale, per_token(act_fmt))
        return SharedInput(act_fmt, torch.Size((*xq.shape[:-1], k)), xq.dtype, x, row_scale, kernels=True)


class SharedInput(NamedTuple):
    """`FP4Backend.quantize_input`'s handle: `x` the quantized input (kernels: bf16 [rows, K] code x block scale,
    `row_scale` float32 [rows] or None for mxfp4; for a consumer reading its FP8 operand cache, float8_e4m3fn rows
    and their float32 row scale; emulated: the float32/64 quantize-dequantize in x's shape),
    `shape` / `dtype` those of the input (the output's leading dims and dtype)."""

    act_fmt: str
    shape: torch.Size
    dtype: torch.dtype
    x: torch.Tensor
    row_scale: torch.Tensor | None
    kernels: bool


def _on_kernels(x: torch.Tensor) -> bool:
    """Whether the linear on `x` runs the Triton kernels (CUDA tensors, kernels available) or emulates."""
    return x.is_cuda and _kernels_available()[0]


def _kernels_available() -> tuple[bool, str]:
    from trace_rl.kernels import available, interpreting

    if interpreting():   # the interpreter runs CPU tensors only; CUDA tensors need compiled kernels
        return False, "TRITON_INTERPRET=1 is set"
    return available()
