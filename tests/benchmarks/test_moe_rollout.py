"""benchmarks/moe_rollout.py's and moe_profile.py's shape-only parts: the batch estimate (call 1's measured B on
the H200 from the shapes alone; the FP4 reference offload raises it) and the profile's kernel classes."""

from __future__ import annotations

import moe_profile as mp
import moe_rollout as mr


def test_estimate_reproduces_call_1_and_offload_raises_fp4_capacity(tmp_path):
    args = mr.parse_args(["--plans", "bf16,fp8,w4a16,w4a4-kv4", "--out", str(tmp_path)])
    rows = {r["plan"]: r for r in mr.estimate_batches(args)}
    measured = {"bf16": 94, "fp8": 247, "w4a16": 125, "w4a4-kv4": 409}      # H200, 2026-12-01, reference kept
    for plan, b in measured.items():
        assert abs(rows[plan]["kept"]["batch"] - b) <= 1, (plan, rows[plan])
    for plan in ("bf16", "fp8"):                                 # nothing to offload
        assert rows[plan]["offloaded"]["batch"] == rows[plan]["kept"]["batch"]
    for plan in ("w4a16", "w4a4-kv4"):                           # the experts' 16.3 GB second copy leaves the GPU
        kept, off = rows[plan]["kept"], rows[plan]["offloaded"]
        assert abs(off["free_GiB"] - kept["free_GiB"] - rows[plan]["experts_GB"] * 1e9 / 2**30) < 1e-6
        assert off["batch"] > kept["batch"]
    assert rows["w4a4-kv4"]["offloaded"]["batch"] <= 512


def test_kernel_classes():
    k = mp.kernel_class
    assert k("experts", "_fp4_grouped_kernel") == k(None, "_fp4_grouped_kernel") == "experts_gemm"
    assert k("experts", "void cutlass::device_kernel<grouped>") == "experts_gemm"       # torch._scaled_grouped_mm
    assert k("experts", "_quantize_rows_kernel") == "act_quant"
    assert k("quantization", "vectorized_elementwise_kernel") == "act_quant"            # fp8_grouped's torch ops
    assert k(None, "_quantize_rows_kernel", "_fp4_grouped_kernel") == "act_quant"
    assert k(None, "_quantize_rows_kernel", "_decode_attention") == "kv_write"
    assert k("router", "topk_kernel") == k("permute", "radixSort") == k("unpermute", "index") == "router_permute"
    assert k("activation", "silu") == "activation" and k(None, "_add_rms_norm_kernel") == "norm"
    assert k("linear", "nvjet_tst_128x64") == k(None, "nvjet_tst_128x64") == "dense_gemm"
    assert k(None, "something_else") == "other"
    assert k("linear", "reduce_kernel<512>") == k("experts", "AbsFunctor") == "act_quant"     # FP8 input quantization
    assert k("experts", "Memset (Device)") == "other"


class _Evt:
    def __init__(self, name, start, end):
        self.name, self.time_range = name, type("T", (), {"start": start, "end": end})()


def test_span_ranges_take_the_innermost_enclosing_span():
    spans = [_Evt("op:experts", 10, 50), _Evt("op:activation", 20, 30), _Evt("op:attention", 60, 70)]
    kernels = [_Evt("a", 5, 8), _Evt("gemm", 10, 19), _Evt("silu", 20, 25), _Evt("mul", 25, 30),
               _Evt("gemm2", 31, 50), _Evt("gap", 52, 55), _Evt("attn", 60, 70)]
    assert mp.span_ranges(kernels, spans) == [None, "experts", "activation", "activation", "experts", None,
                                             "attention"]
