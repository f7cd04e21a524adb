"""KV-cache write kernels against PagedKV.write_reference (bit for bit), random slots, odd sizes, and the
fused decode prologue (q/k RMSNorm + RoPE + K/V write) against its torch reference."""

import pytest
import torch

from trace_rl.formats.paged_kv import KV_FORMATS, PagedKV
from trace_rl.kernels import kv_write, qk_norm_rope_kv_write
from trace_rl.kernels.attention_reference import qk_norm_rope_kv_write_reference

pytestmark = pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")


def _same(a: torch.Tensor | None, b: torch.Tensor | None) -> bool:
    if a is None or b is None:
        return a is b
    bits = {torch.float8_e4m3fn: torch.uint8, torch.bfloat16: torch.int16, torch.float32: torch.int32}
    view = bits.get(a.dtype, a.dtype)
    return a.dtype == b.dtype and torch.equal(a.cpu().view(view), b.cpu().view(view))


def _caches_equal(a: PagedKV, b: PagedKV) -> bool:
    return all(_same(getattr(a, n), getattr(b, n)) for n in ("codes", "scales", "global_scale"))


@pytest.mark.parametrize("kv_format", KV_FORMATS)
@pytest.mark.parametrize("role", ["k", "v"])
@pytest.mark.parametrize("T,H,D,page", [(1, 1, 64, 16), (37, 3, 128, 64), (19, 2, 32, 32)])
def test_kv_write_matches_reference(kv_format, role, T, H, D, page, device, gen):
    blocks = 3
    ref = PagedKV.allocate(kv_format, blocks, page, H, D, role=role)
    cache = PagedKV.allocate(kv_format, blocks, page, H, D, device=device, role=role)
    slots = torch.randperm(blocks * page, generator=gen)[:T]
    x = (torch.randn(T, H, D, generator=gen) * torch.exp(torch.randn(T, H, 1, generator=gen) * 2)).to(torch.bfloat16)
    x[0, 0, :5] = 0.0
    if T > 3:
        x[1, 0, 3] = float("nan")           # a NaN block (its codes are stored as zeros)
        x[2, -1] = 0.0                       # an all-zero row
        x[3, 0, 7] = float("inf")
    ref.write_reference(slots, x)
    kv_write(cache, slots.to(device), x.to(device))
    assert _caches_equal(cache, ref)


def test_kv_write_rejects_wrong_shapes(device):
    cache = PagedKV.allocate("nvfp4", 2, 16, 2, 32, device=device)
    with pytest.raises(ValueError, match="heads"):
        kv_write(cache, torch.zeros(1, dtype=torch.int64, device=device), torch.zeros(1, 3, 32, device=device))
    with pytest.raises(ValueError, match="slots"):
        kv_write(cache, torch.zeros(2, dtype=torch.int64, device=device), torch.zeros(1, 2, 32, device=device))


def _rope_tables(B, D, gen):
    pos = torch.randint(0, 4000, (B,), generator=gen).float()
    inv = 1.0 / (1e6 ** (torch.arange(0, D, 2).float() / D))
    emb = torch.cat((pos[:, None] * inv, pos[:, None] * inv), -1)
    return emb.cos().to(torch.bfloat16), emb.sin().to(torch.bfloat16)


@pytest.mark.parametrize("kv_format", KV_FORMATS)
@pytest.mark.parametrize("qk_norm", [True, False])
def test_qk_norm_rope_kv_write_matches_reference(kv_format, qk_norm, device, gen):
    """q and k equal the torch reference (RMSNorm and RoPE in bf16, as the model computes them) up to one bf16
    ulp (rsqrt differs between devices), and the cache holds exactly `write_reference` of the kernel's k."""
    B, Hq, Hkv, D, page = 5, 6, 2, 64, 16
    qkv = torch.randn(B, (Hq + 2 * Hkv) * D, generator=gen).to(torch.bfloat16)
    q, k, v = (t.view(B, -1, D) for t in qkv.split([Hq * D, Hkv * D, Hkv * D], -1))   # strided views
    cos, sin = _rope_tables(B, D, gen)
    wq, wk = ((torch.rand(D, generator=gen) + 0.5).to(torch.bfloat16) for _ in range(2))
    weights = (wq, wk) if qk_norm else (None, None)
    slots = torch.randperm(4 * page, generator=gen)[:B]
    caches = [PagedKV.allocate(kv_format, 4, page, Hkv, D, device=device, role=r) for r in "kv"]
    k_out = torch.empty(B, Hkv, D, dtype=torch.bfloat16, device=device)
    to = lambda t: None if t is None else t.to(device)  # noqa: E731
    q_out = qk_norm_rope_kv_write(to(q), to(k), to(v), to(cos), to(sin), *caches, to(slots), *map(to, weights),
                                  1e-6, k_out=k_out)
    refs = [PagedKV.allocate(kv_format, 4, page, Hkv, D, role=r) for r in "kv"]
    q_ref, k_ref = qk_norm_rope_kv_write_reference(q, k, v, cos, sin, *refs, slots, *weights, 1e-6)
    for got, want in ((q_out, q_ref), (k_out, k_ref)):
        torch.testing.assert_close(got.cpu().float(), want.float(), rtol=2 ** -7, atol=1e-6)
    own = [PagedKV.allocate(kv_format, 4, page, Hkv, D, role=r) for r in "kv"]
    own[0].write_reference(slots, k_out.cpu())
    own[1].write_reference(slots, v)
    assert _caches_equal(caches[0], own[0]) and _caches_equal(caches[1], own[1])
