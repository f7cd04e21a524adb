"""The Gluon decode attention as a KV-cache path (trace_rl/kv/gluon.py), on CPU: forcing it where it cannot run is
an error naming why and the fix (never a fallback), "auto" times it where it can run (GLUON_IN_AUTO) and leaves it
out, without an error, where it cannot (CPU, shape, flag cleared), the path name parses,
and decode dispatches to the kernel. The numbers: tests/engine/test_native_gpu.py (sm_90, Triton 3.6)."""

from __future__ import annotations

import pytest
import torch

from trace_rl.kv import PagedKVCache, gluon
from trace_rl.kv.cache import ATTENTION_CHOICES, GLUON_PATH, KERNEL_PATH, PATHS, parse_path, reads_span


@pytest.mark.parametrize("fmt,block,d,hkv,hq,match", [
    ("bf16", 16, 128, 2, 8, "nvfp4 or mxfp4 KV caches only, this one is 'bf16'"),
    ("fp8_e4m3", 64, 128, 2, 8, "nvfp4 or mxfp4 KV caches only"),
    ("nvfp4", 16, 128, 2, 8, "pages of 64 tokens .* are 16: leave block_size"),
    ("mxfp4", 32, 128, 2, 8, "pages of 64 tokens .* are 32: leave block_size at the mxfp4 default"),
    ("mxfp4", 64, 64, 2, 8, "head_dim 128, this model's is 64"),
    ("mxfp4", 64, 128, 2, 7, "1..16 query heads per KV head"),
    ("nvfp4", 64, 64, 2, 8, "head_dim 128, this model's is 64"),
    ("nvfp4", 64, 128, 2, 40, "1..16 query heads per KV head, this model has 40 over 2"),
    ("nvfp4", 64, 128, 2, 7, "1..16 query heads per KV head"),
])
def test_forcing_gluon_on_a_cache_it_cannot_read_is_refused(fmt, block, d, hkv, hq, match):
    with pytest.raises(ValueError, match=f"attention='gluon': the Gluon decode attention .*{match}"):
        PagedKVCache(fmt, 1, 4, block, hkv, d, attention="gluon", query_heads=hq)


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_forcing_gluon_without_an_sm90_gpu_is_refused(fmt):
    """The right cache shape on a CPU: a RuntimeError naming the machine, not the torch reference."""
    assert gluon.refusal(fmt, 64, 128, 2, 8) == ""
    with pytest.raises(RuntimeError, match="attention='gluon': .*sm_90 GPU .* on cpu"):
        PagedKVCache(fmt, 1, 4, 64, 2, 128, attention="gluon", query_heads=8)
    assert "sm_90" in PagedKVCache(fmt, 1, 4, 64, 2, 128, query_heads=8).gluon_refusal()
    assert "sm_90" in gluon.why_not(fmt, 64, 128, 2, 8, torch.device("cpu"))


def test_gluon_path_name():
    assert "gluon" in ATTENTION_CHOICES and GLUON_PATH == "kernels.decode_attention_gluon" and GLUON_PATH in PATHS
    assert parse_path(GLUON_PATH) == (GLUON_PATH, None) and not reads_span(GLUON_PATH)
    assert "torch.gluon" not in PATHS
    with pytest.raises(ValueError, match="unknown decode-attention path"):
        parse_path(GLUON_PATH + ":s2")


def test_scope_is_the_kernels():
    """kv/gluon.py states the kernel's scope without importing Triton; it must be the launcher's."""
    kernel = pytest.importorskip("trace_rl.kernels.paged_attention_gluon")
    assert (gluon.PAGE, gluon.HEAD_DIM, gluon.MAX_GROUP) == (kernel.PAGE, kernel.HEAD_DIM, kernel.N_PAD)
    assert set(gluon.KV_FORMATS) == {f.split(":")[0] for f in kernel.FORMATS}


def _runnable(cache: PagedKVCache) -> PagedKVCache:
    cache._kernels_ok, cache._gluon_why = True, ""          # as on an H200 with Triton 3.6
    return cache


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_auto_times_gluon_where_it_can_run(fmt, monkeypatch):
    assert gluon.GLUON_IN_AUTO is True                      # its GPU tests passed on the H200 (results/*_1202b*)
    cache = _runnable(PagedKVCache(fmt, 1, 4, 64, 2, 128, query_heads=8))
    assert cache.candidates(False) == [KERNEL_PATH, GLUON_PATH]
    refused = _runnable(PagedKVCache("nvfp4", 1, 4, 64, 2, 128, query_heads=8))
    refused._gluon_why = "not here"
    assert refused.candidates(False) == [KERNEL_PATH]
    monkeypatch.setattr(gluon, "GLUON_IN_AUTO", False)      # the flag still takes it out
    assert cache.candidates(False) == [KERNEL_PATH]


@pytest.mark.parametrize("fmt,block,d,hq", [("nvfp4", 64, 128, 8), ("nvfp4", 16, 128, 8), ("bf16", 16, 128, 8),
                                            ("nvfp4", 64, 64, 8), ("nvfp4", 64, 128, 40), ("mxfp4", 64, 128, 8),
                                            ("fp8_e4m3", 64, 128, 8)])
def test_auto_leaves_gluon_out_where_it_cannot_run(fmt, block, d, hq):
    """As it is here (CPU, no sm_90): "auto" builds, lists no Gluon path and raises nothing, whatever the cache."""
    assert gluon.GLUON_IN_AUTO
    cache = PagedKVCache(fmt, 1, 4, block, 2, d, query_heads=hq)
    assert cache.gluon_refusal()
    assert GLUON_PATH not in cache.candidates(False) and GLUON_PATH not in cache.candidates(True, 4, 128, 256)
    assert cache.attention_path != GLUON_PATH
    cache._kernels_ok = True                                 # kernels but no sm_90 GPU: still left out
    assert GLUON_PATH not in cache.candidates(False)


def test_auto_engine_on_cpu_never_times_gluon():
    """A native engine with attention="auto" over an nvfp4 cache of the Gluon kernel's shape, on CPU: builds, decodes
    on the torch reference, no Gluon path among its candidates."""
    from dataclasses import replace

    from trace_rl.engine.native import NativeEngine
    from trace_rl.models import build, preset
    from trace_rl.plan import PrecisionPlan

    config = replace(preset("tiny"), hidden_size=256, num_heads=4, num_kv_heads=2, head_dim=128, num_layers=1)
    model = build(config)
    model.init_random(generator=torch.Generator().manual_seed(0))
    engine = NativeEngine(model, PrecisionPlan(kv_cache="nvfp4"), max_batch=2, max_seq_len=64)
    assert engine.attention_candidates(2, 64) == ["torch.reference"]
    assert engine.attention_path(2, 40) == "torch.reference"


def test_decode_dispatches_to_the_gluon_kernel(monkeypatch):
    from trace_rl import kernels

    calls = []
    monkeypatch.setattr(kernels, "decode_attention_gluon",
                        lambda q, k, v, table, lens, scale: calls.append((k, v, table.shape, scale)) or q)
    cache = PagedKVCache("nvfp4", 2, 4, 64, 2, 128, query_heads=8)
    q, table, lens = torch.zeros(1, 8, 128), torch.zeros(1, 3, dtype=torch.int32), torch.ones(1, dtype=torch.int32)
    assert cache.decode(1, q, table, lens, 0.5, None, GLUON_PATH) is q
    assert calls == [(cache.k[1], cache.v[1], (1, 3), 0.5)]


def test_engine_refuses_gluon_where_it_cannot_run():
    """The native engine passes its model's query heads: a GQA group, head_dim or page size the kernel lacks, or a
    CPU, is refused when the engine is built."""
    from dataclasses import replace

    from trace_rl.engine.native import NativeEngine
    from trace_rl.models import build, preset, tiny_model
    from trace_rl.plan import PrecisionPlan

    plan = PrecisionPlan(kv_cache="nvfp4")
    tiny, _ = tiny_model("tiny")
    with pytest.raises(ValueError, match="head_dim 128, this model's is 32"):
        NativeEngine(tiny, plan, max_batch=2, max_seq_len=64, attention="gluon")
    config = replace(preset("tiny"), hidden_size=256, num_heads=4, num_kv_heads=2, head_dim=128, num_layers=1)
    model = build(config)
    model.init_random(generator=torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match="pages of 64 tokens"):
        NativeEngine(model, plan, max_batch=2, max_seq_len=64, block_size=16, attention="gluon")
    with pytest.raises(RuntimeError, match="sm_90 GPU"):
        NativeEngine(model, plan, max_batch=2, max_seq_len=64, attention="gluon")
    with pytest.raises(ValueError, match="nvfp4 or mxfp4 KV caches only"):
        NativeEngine(model, None, max_batch=2, max_seq_len=64, attention="gluon")
