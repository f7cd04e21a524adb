"""The opt-in Gluon warp-specialised nvfp4 decode attention (paged_attention_gluon.py): launcher checks on CPU; on an
sm_90 GPU with Triton 3.6, a ragged problem (odd lengths, tails of 1-88 tokens, an empty sequence, a one-token one,
pages scattered, garbage block-table entries past each sequence, stale NaN V scales in unwritten slots) against the
float64 reference and the shipped Triton kernel, per sequence."""

import importlib.util
import os
import sys

import pytest
import torch
import triton

from trace_rl.formats.paged_kv import PagedKV

pytestmark = pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")
_SM90_36 = torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0) and \
    triton.__version__.startswith("3.6")
gpu36 = [pytest.mark.gpu, pytest.mark.skipif(not _SM90_36, reason="needs an sm_90 GPU and Triton 3.6 (Gluon)")]


def _decode_attention_tests():
    """tests/kernels/test_decode_attention.py (its _setup and float64 reference; tests/kernels is no package)."""
    name = "trace_rl_test_decode_attention"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, os.path.join(os.path.dirname(__file__),
                                                                         "test_decode_attention.py"))
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        sys.modules[name] = mod
    return sys.modules[name]


def test_launcher_refuses_unsupported_shapes():
    gluon = pytest.importorskip("trace_rl.kernels.paged_attention_gluon")
    q = torch.zeros(1, 8, 128, dtype=torch.bfloat16)
    bt, sl = torch.zeros(1, 2, dtype=torch.int32), torch.ones(1, dtype=torch.int32)
    k = PagedKV.allocate("bf16", 4, 16, 2, 128, role="k")
    with pytest.raises(ValueError, match="nvfp4"):
        gluon.decode_attention_gluon(q, k, k, bt, sl, 0.1)
    k = PagedKV.allocate("nvfp4", 4, 32, 2, 128, role="k")
    v = PagedKV.allocate("nvfp4", 4, 32, 2, 128, role="v")
    with pytest.raises(ValueError, match="pages of 64"):
        gluon.decode_attention_gluon(q, k, v, bt, sl, 0.1)
    k = PagedKV.allocate("nvfp4", 4, 64, 2, 64, role="k")
    v = PagedKV.allocate("nvfp4", 4, 64, 2, 64, role="v")
    with pytest.raises(ValueError, match="head_dim 128"):
        gluon.decode_attention_gluon(q[..., :64], k, v, bt, sl, 0.1)
    k = PagedKV.allocate("nvfp4", 4, 64, 2, 128, role="k")
    v = PagedKV.allocate("nvfp4", 4, 64, 2, 128, role="v")
    with pytest.raises(ValueError, match="role"):
        gluon.decode_attention_gluon(q, k, k, bt, sl, 0.1)
    with pytest.raises(ValueError, match="group"):
        gluon.decode_attention_gluon(torch.zeros(1, 34, 128, dtype=torch.bfloat16), k, v, bt, sl, 0.1)
    with pytest.raises(ValueError, match="stages"):
        gluon.GluonAttentionConfig(stages=1).check()


@gpu36[0]
@gpu36[1]
@pytest.mark.parametrize("group", [4, 1, 16])
@pytest.mark.parametrize("stages", [2, 3])
def test_matches_reference_and_shipped_gpu(group, stages, gen):
    from trace_rl.kernels.paged_attention import decode_attention
    from trace_rl.kernels.paged_attention_gluon import GluonAttentionConfig, decode_attention_gluon

    t = _decode_attention_tests()
    # tails (length mod 128) 1, 88, 5, 0, 64, 127, 1 and an empty sequence; 3000 = 23 tiles + 56
    lens = [1, 600, 133, 0, 1024, 3000, 255, 88, 129]
    q, k, v, bt, sl = t._setup("nvfp4", lens, 8 if group < 16 else 2, group, 128, 64, "cuda", gen)
    ref = t._reference64(q, k, v, bt, sl, 128 ** -0.5)
    args = (q.cuda(), k, v, bt.cuda(), sl.cuda(), 128 ** -0.5)
    out = decode_attention_gluon(*args, config=GluonAttentionConfig(stages=stages))
    shipped = decode_attention(*args, splits=1)
    assert not out.isnan().any()
    for b in range(len(lens)):       # per sequence: a wrong tail must not hide behind a long neighbour
        if lens[b] == 0:
            assert (out[b] == 0).all()
            continue
        assert t._rel_err(out[b : b + 1], ref[b : b + 1]) < 1e-2, (b, lens[b])
        assert t._rel_err(out[b : b + 1], shipped[b : b + 1].double().cpu()) < 2e-3, (b, lens[b])
    assert torch.equal(decode_attention_gluon(*args, config=GluonAttentionConfig(stages=stages)), out)
