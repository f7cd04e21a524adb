"""The FP8 operand cache's weight sync (kernels/operand_cache_fp8.py, issue 16): the direct E4M3 writer (per-block byte
tables) writes the old writer's bytes and inexact count bit for bit (every code x every scale byte, odd shapes; GPU:
Qwen3-8B shapes and wide-span weights), and `deferred_exactness_check` reads all of a sync's counts at once, raising
one InexactWeight that names every weight E4M3 cannot hold."""

import pytest
import torch

from tests.kernels.test_fp4_dequant import _q
from tests.kernels.test_operand_cache_fp8 import _same_e4m3
from trace_rl.backends import QuantLinear
from trace_rl.kernels import operand_cache
from trace_rl.kernels import operand_cache_fp8 as f8
from trace_rl.kernels.hopper_fp4 import operand, to_hopper
from trace_rl.kernels.linear import hopper_weight

pytestmark = [pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning"),
              pytest.mark.filterwarnings("ignore:overflow:RuntimeWarning")]


def _every_code_and_scale():
    """codes uint8 [256, 256] and scales uint8 [256, 16]: row r has scale byte r in every block, block j code j in
    every element (K = 512: all 16 codes x all 256 scale bytes)."""
    byte = torch.arange(16, dtype=torch.uint8).repeat_interleave(16)
    return (byte | (byte << 4)).repeat(256, 1), torch.arange(256, dtype=torch.uint8)[:, None].repeat(1, 16)


def _old_writer_spec(codes, scales):
    """What `_weight_e4m3_kernel` computes, in float64/torch casts: the bf16 operand code x 2**(b - 253) (float32
    product, then bf16, both ties to even; b = 0: 0, b = 255: +-Inf or NaN), x 32, to E4M3 (0x7F where not
    finite); inexact = finite and E4M3 != the value."""
    b = codes.to(torch.int64)
    c = torch.stack([b & 15, b >> 4], dim=-1).reshape(b.shape[0], -1)
    e2m1 = torch.tensor([0, 0.5, 1, 1.5, 2, 3, 4, 6], dtype=torch.float64)[c & 7] * torch.where(c >= 8, -1.0, 1.0)
    s = scales.to(torch.int64).repeat_interleave(32, dim=1)
    scale = torch.where(s == 255, float("inf"), torch.where(s == 0, 0.0, torch.ldexp(torch.ones(()), s - 253.0)))
    v = (e2m1 * scale.double()).float().to(torch.bfloat16).float() * 32
    finite = torch.isfinite(v)
    e4 = torch.where(finite, v, 0.0).to(torch.float8_e4m3fn)
    return torch.where(finite, e4.view(torch.uint8), 0x7F), finite & (e4.float() != v)


def test_direct_writer_equals_old_writer_on_every_code_and_scale(device):
    """All 16 codes x all 256 scale bytes (NaN b = 255, b = 0, the exact range b >= 240, the rounded range and where
    the bf16 operand underflows): the direct writer's integer twin = the old writer's float spec (bytes and each
    inexact flag), and both kernels (interpreter on CPU) write those bytes and count those flags."""
    codes, scales = _every_code_and_scale()
    twin, flags = f8.direct_e4m3_twin(codes, scales)
    spec, spec_flags = _old_writer_spec(codes, scales)
    assert torch.equal(twin, spec.to(torch.uint8)) and torch.equal(flags, spec_flags)
    assert flags.any() and (twin == 0x7F).sum() == 16 * 32 and (twin == 0x80).any()       # the cases are all there
    for kernel in (f8._weight_e4m3_kernel, f8._weight_e4m3_direct_kernel):
        out = torch.empty(256, 512, dtype=torch.uint8, device=device)
        count = torch.zeros(1, dtype=torch.int32, device=device)
        kernel[(16, 2)](codes.to(device), scales.to(device), out, count, 256, 512, 256, 16, 512, BN=16, BK=256)
        assert torch.equal(out.cpu(), twin), kernel
        assert int(count) == int(flags.sum()), kernel


@pytest.mark.parametrize("direct", [True, False])
def test_writers_agree_at_odd_shapes(direct, device, gen):
    """Both writers through `write_weight_e4m3` (odd N, ragged last tile) against the torch spec."""
    q = _q(37, 96, "mxfp4", gen)
    ref, bad = f8.weight_e4m3_reference(to_hopper(q))
    out = torch.empty(37, 96, dtype=torch.float8_e4m3fn, device=device)
    count = torch.zeros(1, dtype=torch.int32, device=device)
    f8.write_weight_e4m3(q.to(device), to_hopper(q.to(device)), out, count, direct=direct)
    _same_e4m3(out.cpu(), ref)
    assert int(count) == bad


def _inexact(w):
    """`w` with row 0's first block ~21 binades below the row's largest: E4M3 cannot hold it."""
    w = w.clone()
    w[0, :32] = torch.linspace(0.1, 6.0, 32) * 2.0 ** -20
    return w


def test_deferred_check_reads_once_and_names_every_inexact_weight(monkeypatch, device, gen):
    """Inside `deferred_exactness_check` no refresh reads its count back (`write` is never called); leaving it raises
    once, naming every inexact weight in sync order with its count and the fix; nested uses join the outer one; an
    error in the body is not replaced; the batched `load_linear_weights` runs in one."""
    from trace_rl.backends.quant_linear import fp8_sync_check, load_linear_weights

    N, K = 32, 160
    layers = {name: QuantLinear(torch.randn(N, K, generator=gen), "mxfp4").to(device)
              for name in ("layers.0.o_proj", "layers.0.down_proj", "layers.1.o_proj")}
    for name, layer in layers.items():
        assert f8.attach_fp8(layer.packed, name) is not None

    def no_read(self, q):
        raise AssertionError("a per-weight host read inside the deferred check")

    monkeypatch.setattr(f8.OperandCacheFP8, "write", no_read)
    ok = torch.randn(N, K, generator=gen).to(device)
    bad = _inexact(torch.randn(N, K, generator=gen) * 3).to(device)
    a, b, c = layers.values()
    with pytest.raises(f8.InexactWeight) as err:
        with f8.deferred_exactness_check():
            a.load_weight(bad)
            b.load_weight(ok)
            c.load_weight(bad)
    assert err.value.names == ["layers.0.o_proj", "layers.1.o_proj"] and min(err.value.counts) > 0
    assert "2 weight(s)" in str(err.value) and "use the bf16 cache for them" in str(err.value)
    assert "rollout.operand_cache: bf16" in str(err.value) and "layers.0.down_proj" not in str(err.value)
    with f8.deferred_exactness_check():                     # all fit: nothing raised
        for layer in layers.values():
            layer.load_weight(ok)
    assert f8.is_fp8(a.packed) and torch.equal(a.packed.layout[operand_cache.KEY].buf.float().cpu(),
                                               operand(hopper_weight(a.packed)).float().cpu() * 32)
    with pytest.raises(f8.InexactWeight) as err:
        with f8.deferred_exactness_check() as outer:
            with f8.deferred_exactness_check() as inner:
                assert inner is outer
                b.load_weight(bad)
            a.load_weight(bad)                             # the inner exit raised nothing: checked at the outer
    assert err.value.names == ["layers.0.down_proj", "layers.0.o_proj"]
    with pytest.raises(KeyError, match="the body's own"):
        with f8.deferred_exactness_check():
            a.load_weight(bad)
            raise KeyError("the body's own")
    assert f8._deferred() is None
    with pytest.raises(f8.InexactWeight) as err:
        load_linear_weights([(a, bad.cpu(), None), (b, ok.cpu(), None), (c, bad.cpu(), None)])
    assert err.value.names == ["layers.0.o_proj", "layers.1.o_proj"]
    monkeypatch.undo()
    with pytest.raises(f8.InexactWeight, match="layers.0.o_proj: [0-9]+ operand values"):
        a.load_weight(bad)                                 # outside: the per-weight check
    with fp8_sync_check() as col:
        assert isinstance(col, f8._Deferred)


# ---- GPU ----

def _wide_span(N, K, gen):
    """An mxfp4 weight whose blocks sit 0-24 binades below their row's largest: every rounding case of the writers
    (exact, rounded subnormals, flushed to 0) in one weight."""
    from trace_rl.formats import get_format

    w = torch.randn(N, K, generator=gen)
    w = w * torch.exp2(-torch.randint(0, 25, (N, K // 32), generator=gen).float()).repeat_interleave(32, dim=1)
    return get_format("mxfp4").quantize(w.cuda())


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("N,K,wide", [(6144, 4096, False), (24576, 4096, False), (4096, 12288, False),
                                      (4096, 4096, True), (771, 4160, True)])
def test_writers_bit_identical_gpu(N, K, wide, gen):
    """Compiled, on random weights at Qwen3-8B's shapes (they fit E4M3) and wide-span ones (many inexact values):
    the direct writer's bytes and count = the old writer's = the torch spec."""
    from trace_rl.formats import get_format

    q = (_wide_span(N, K, gen) if wide else
         get_format("mxfp4").quantize((torch.randn(N, K, generator=gen) * torch.exp(torch.randn(N, 1, generator=gen)))
                                      .cuda()))
    h = to_hopper(q)
    outs, counts = [], []
    for direct in (True, False):
        out = torch.empty(N, K, dtype=torch.float8_e4m3fn, device="cuda")
        count = torch.zeros(1, dtype=torch.int32, device="cuda")
        f8.write_weight_e4m3(q, h, out, count, direct=direct)
        outs.append(out)
        counts.append(int(count))
    assert torch.equal(outs[0].view(torch.uint8), outs[1].view(torch.uint8)) and counts[0] == counts[1]
    ref, bad = f8.weight_e4m3_reference(h)
    _same_e4m3(outs[0], ref)
    assert counts[0] == bad and (bad > 0) == wide


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_sync_with_several_inexact_weights_raises_once_gpu(monkeypatch, gen):
    """12 linears on the GPU, 3 of them inexact after the sync: the batched load raises one InexactWeight naming the
    3 in order (no per-weight read); the caches hold the new weights; a fitting sync passes."""
    from trace_rl.backends.quant_linear import load_linear_weights

    shapes = [(1024, 4096), (4096, 4096), (4096, 12288)] * 4
    layers = [QuantLinear(torch.randn(n, k, generator=gen).to(torch.bfloat16).cuda(), "mxfp4") for n, k in shapes]
    names = [f"layers.{i // 3}.{('k_proj', 'o_proj', 'down_proj')[i % 3]}" for i in range(len(shapes))]
    for layer, name in zip(layers, names):
        assert f8.attach_fp8(layer.packed, name) is not None
    monkeypatch.setattr(f8.OperandCacheFP8, "write", lambda self, q: pytest.fail("a per-weight host read"))
    new = [torch.randn(n, k, generator=gen).to(torch.bfloat16) for n, k in shapes]
    bad = {1, 6, 11}
    for i in bad:
        new[i][5, 64:96] = torch.linspace(0.1, 6.0, 32).to(torch.bfloat16) * 2.0 ** -22
    with pytest.raises(f8.InexactWeight) as err:
        load_linear_weights([(layer, w.cuda(), None) for layer, w in zip(layers, new)])
    assert err.value.names == [names[i] for i in sorted(bad)] and all(n > 0 for n in err.value.counts)
    for i, layer in enumerate(layers):          # written (rounded where inexact), no layer skipped
        exact = torch.equal(layer.packed.layout[operand_cache.KEY].buf.float(),
                            operand(hopper_weight(layer.packed)).float() * 32)
        assert exact == (i not in bad)
    load_linear_weights([(layer, torch.randn(n, k, generator=gen).cuda(), None)
                         for layer, (n, k) in zip(layers, shapes)])          # fits again: no error
