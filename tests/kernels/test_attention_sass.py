"""Compile gate (CPU, no GPU): the shipped decode-attention configurations compiled for sm_90 keep the
decoded K/V tiles in registers (HGMMA's A operand; no STS/LDSM of decoded tiles in the loop) and stay under
their SASS budget per K/V element (trace_rl/kernels/attention_sass.py)."""

import pytest

from trace_rl.kernels.attention_sass import BUDGET, SHIPPED, attention_loop_subprocess

pytest.importorskip("triton.backends.nvidia", reason="needs Triton's NVIDIA backend (ptxas, cuobjdump)")


@pytest.mark.parametrize("kv_format", SHIPPED)
def test_shipped_attention_loop(kv_format):
    r = attention_loop_subprocess(kv_format)
    hgmma = sum(c for op, c in r.opcodes.items() if op.startswith("HGMMA"))
    assert hgmma > 0, r.opcodes
    if kv_format == "bf16":
        assert r.hgmma_smem_a == hgmma                 # both operands through shared memory (cp.async)
    else:
        assert r.hgmma_register_a == hgmma             # decoded K / V^T are the register A operand
    # A decoded [128, 128] bf16 tile through shared memory would take 16 STS.128 and 16 LDSM per thread (64
    # and up to 64 more for V); what is left is the P^T tile (2 STSM), the softmax's cross-warp max and small
    # scale moves. fp8 (2 cp.async stages since the tail fix) keeps its words in the pipeline's buffers; the
    # bound stays loose enough for an unpipelined fp8 build, whose packed words are re-laid through shared
    # memory once (raw bytes, not decoded tiles: STS.128, no LDSM).
    assert r.shared_stores <= (32 if kv_format == "fp8_e4m3" else 8) and r.ldsm <= 4, r.opcodes
    assert r.per_element <= BUDGET[kv_format], (r.per_element, r.opcodes)
