"""The decode-step profile attributes each GPU kernel to the op range that launched it, or by its name."""

from __future__ import annotations

from types import SimpleNamespace as NS

from torch.autograd import DeviceType

from trace_rl.bench.profile import classify, layer_kernels
from trace_rl.op_ranges import PREFIX


def _cpu(i, name, parent=None):
    return NS(id=i, name=name, cpu_parent=parent, device_type=DeviceType.CPU)


def _gpu(name, start, dur, corr=0):
    return NS(name=name, device_type=DeviceType.CUDA, linked_correlation_id=corr,
              time_range=NS(start=start, end=start + dur))


def test_classify_by_range_then_by_name():
    rope = _cpu(1, PREFIX + "rope")
    mul = _cpu(2, "aten::mul", rope)
    lin = _cpu(3, PREFIX + "linear")
    mm = _cpu(4, "aten::mm", lin)
    events = [rope, mul, lin, mm,
              _gpu("elementwise_kernel<mul>", 0, 1000, corr=2),         # torch op inside the rope range
              _gpu("nvjet_sm90_gemm", 1000, 3000, corr=4),              # cuBLAS inside the linear range
              _gpu("_quantize_rows_kernel", 4000, 500),                 # Triton, before an FP4 GEMM
              _gpu("_fp4_gemm_kernel", 4500, 2000),
              _gpu("_quantize_rows_kernel", 6500, 250),                 # Triton, before attention: KV write
              _gpu("_decode_attention_kernel", 6750, 4000),
              _gpu("_sample_kernel", 10750, 100)]
    per_class, per_kernel, count = classify(NS(events=lambda: events))
    assert count == 7
    assert per_class == {"rope": 1.0, "linear": 5.0, "quantization": 0.5, "kv_write": 0.25, "attention": 4.0,
                         "sampling": 0.1}
    assert per_kernel["_quantize_rows_kernel"] == 0.75


def test_gpu_side_ranges_are_spans_not_kernels():
    """torch records a `record_function` range on the GPU too ("gpu_user_annotation", a CUDA event named like the
    range): it is not a kernel, and kernels inside its span without a CPU op of their own (Triton's) take its class."""
    lin = _cpu(1, PREFIX + "linear")
    mm = _cpu(2, "aten::mm", lin)
    events = [lin, mm,
              _gpu(PREFIX + "linear", 0, 5000),                         # the range's GPU-side span
              _gpu(PREFIX + "activation", 5000, 1000),
              _gpu("_quantize_dequant_rows_kernel", 0, 500),            # Triton inside linear: quantization
              _gpu("nvjet_sm90_gemm", 500, 4000, corr=2),
              _gpu("_epilogue_kernel", 4500, 400),                      # Triton inside linear
              _gpu("vectorized_elementwise_kernel", 5000, 900)]         # inside activation, no CPU link
    per_class, _, count = classify(NS(events=lambda: events))
    assert count == 4
    assert per_class == {"quantization": 0.5, "linear": 4.4, "activation": 0.9}


def test_layer_kernels_cut_at_the_second_layers_norms():
    """Layer 1 runs from its input norm (the 3rd residual-add RMSNorm launch) to layer 2's (the 5th)."""
    rows = []
    for layer in range(3):
        rows += [("_add_rms_norm_kernel", "norm", 0.01),
                 (f"_quantize_dequant_rows_kernel{layer}", "quantization", 0.02), ("nvjet_gemm", "linear", 0.1),
                 ("_add_rms_norm_kernel", "norm", 0.01), ("nvjet_gemm", "linear", 0.2)]
    rows.append(("_add_rms_norm_kernel", "norm", 0.01))                   # the final norm
    layer1 = layer_kernels(rows, 1)
    assert len(layer1) == 5 and layer1[1][0] == "_quantize_dequant_rows_kernel1"
    assert layer_kernels(rows[:10], 1) == []                              # no third layer: no end found
