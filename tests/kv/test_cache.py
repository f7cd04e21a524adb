"""The engine's paged KV cache: decode-attention paths against the kernels' torch spec, page copies, prefill."""

from __future__ import annotations

import pytest
import torch

from trace_rl.formats.paged_kv import slots_for
from trace_rl.kernels.attention_reference import decode_attention_reference
from trace_rl.kv import KVStep, PagedKVCache
from trace_rl.kv import decode_attention as attn

pytestmark = pytest.mark.usefixtures("one_torch_thread")
FORMATS = ("bf16", "fp8_e4m3", "nvfp4", "mxfp4")


def _filled_cache(fmt, rng, device="cpu", dtype=torch.float32, batch=3, pages=5, block=16, hkv=2, d=32,
                  shuffle=True):
    cache = PagedKVCache(fmt, 1, batch * pages + 2, block, hkv, d, device=device, dtype=dtype)
    order = torch.randperm(batch * pages + 2, generator=rng)[: batch * pages] if shuffle \
        else torch.arange(batch * pages)
    table = order.view(batch, pages).to(torch.int32).to(device)
    lens = torch.randint(1, pages * block + 1, (batch,), generator=rng)
    lens[0] = pages * block                                              # one full table
    pos = torch.arange(pages * block).expand(batch, -1)
    slots = slots_for(table.cpu(), pos, block).reshape(-1).to(device)
    k = torch.randn(batch * pages * block, hkv, d, generator=rng).to(device, dtype)
    v = torch.randn(batch * pages * block, hkv, d, generator=rng).to(device, dtype)
    cache.write(0, slots, k, v)
    return cache, table, lens.to(torch.int32).to(device)


@pytest.mark.parametrize("fmt", FORMATS)
def test_reference_decode_attention_matches_kernel_spec(fmt, rng):
    cache, table, lens = _filled_cache(fmt, rng)
    q = torch.randn(3, 6, 32, generator=rng)
    got = attn.reference(q, cache.k[0], cache.v[0], table, lens, 32 ** -0.5)
    want = decode_attention_reference(q, cache.k[0], cache.v[0], table, lens, 32 ** -0.5)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_copy_pages_copies_codes_and_scales(rng):
    cache, table, _ = _filled_cache("nvfp4", rng)
    src, dst = table[0, :2].long(), table[1, :2].long()
    cache.copy_pages(src, dst)
    for c in cache.k + cache.v:
        for t in (c.codes, c.scales, c.global_scale):
            assert torch.equal(t[dst].view(torch.uint8) if t.dtype == torch.float8_e4m3fn else t[dst],
                               t[src].view(torch.uint8) if t.dtype == torch.float8_e4m3fn else t[src])


@pytest.mark.parametrize("fmt", ["bf16", "nvfp4"])
def test_prefill_attends_over_what_was_written(fmt, rng):
    """Prefill's causal attention reads K/V back from the cache (quantized on write), so position t of a
    prompt sees the same K/V values a later decode step reads."""
    cache = PagedKVCache(fmt, 1, 4, 16, 2, 32)     # quantized pages are a multiple of 16 tokens
    table = torch.tensor([[2, 0]], dtype=torch.int32)
    pos = torch.arange(21)[None]
    step = KVStep(cache, slots_for(table, pos, 16), table, torch.tensor([21], dtype=torch.int32), prefill=True)
    q, k, v = (torch.randn(1, 21, h, 32, generator=rng) for h in (6, 2, 2))
    out = step.attend(0, q, k, v)
    last = attn.reference(q[:, -1], cache.k[0], cache.v[0], table, torch.tensor([21]), 32 ** -0.5)
    torch.testing.assert_close(out[:, -1], last, rtol=1e-5, atol=1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("path", ["flash_varlen", "efficient_varlen", "sdpa_masked"])
def test_fast_bf16_paths_match_reference(path, rng):
    batch, pages, block = 5, 6, 16
    cache, table, lens = _filled_cache("bf16", rng, "cuda", torch.bfloat16, batch, pages, block, hkv=8, d=128,
                                       shuffle=False)
    q = torch.randn(batch, 32, 128, generator=rng).to("cuda", torch.bfloat16)
    fast = getattr(attn, path)(q, cache.k[0], cache.v[0], lens, 128 ** -0.5, pages * block)
    ref = attn.reference(q, cache.k[0], cache.v[0], table, lens, 128 ** -0.5)
    torch.testing.assert_close(fast.float(), ref.float(), rtol=2e-2, atol=2e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", [None, "cudnn"])
def test_sdpa_span_paths_match_reference(backend, rng):
    batch, pages, block = 4, 6, 16
    cache, table, lens = _filled_cache("bf16", rng, "cuda", torch.bfloat16, batch, pages, block, hkv=8, d=128,
                                       shuffle=False)
    q = torch.randn(batch, 32, 128, generator=rng).to("cuda", torch.bfloat16)
    span = int(lens.max())                           # reads only the longest row's positions of each slot
    fast = attn.sdpa_masked(q, cache.k[0], cache.v[0], lens, 128 ** -0.5, pages * block, span, backend)
    ref = attn.reference(q, cache.k[0], cache.v[0], table, lens, 128 ** -0.5)
    torch.testing.assert_close(fast.float(), ref.float(), rtol=2e-2, atol=2e-2)


def test_attend_prologue_equals_norm_rope_then_attend(rng, monkeypatch):
    """The fused-prologue entry (the kernels' q/k-norm + RoPE + K/V write, stood in for here by its torch
    equivalent) feeds decode attention exactly as norm, RoPE and `attend` do."""
    from trace_rl import kernels
    from trace_rl.models.rope import apply_rope

    def rms(x, w, eps):
        return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))

    def fake(q, k, v, cos, sin, k_cache, v_cache, slots, qn, kn, eps):
        q = apply_rope(rms(q, qn, eps)[:, None], cos[:, None], sin[:, None])[:, 0]
        k = apply_rope(rms(k, kn, eps)[:, None], cos[:, None], sin[:, None])[:, 0]
        k_cache.write_reference(slots, k)
        v_cache.write_reference(slots, v)
        return q

    monkeypatch.setattr(kernels, "qk_norm_rope_kv_write", fake, raising=False)
    b, hq, hkv, d = 3, 4, 2, 32
    caches = [PagedKVCache("bf16", 1, 8, 8, hkv, d, dtype=torch.float32) for _ in range(2)]
    table = torch.tensor([[0, 1], [2, 3], [4, 5]], dtype=torch.int32)
    pos = torch.tensor([[5], [9], [0]])
    steps = [KVStep(c, slots_for(table, pos, 8), table, (pos[:, 0] + 1).to(torch.int32), prefill=False)
             for c in caches]
    q, k, v = (torch.randn(b, 1, h, d, generator=rng) for h in (hq, hkv, hkv))
    ang = torch.randn(b, 1, d // 2, generator=rng)
    cos, sin = torch.cat([ang.cos()] * 2, -1), torch.cat([ang.sin()] * 2, -1)
    qn, kn = torch.rand(d, generator=rng) + 0.5, torch.rand(d, generator=rng) + 0.5
    fused = steps[0].attend_prologue(0, q, k, v, cos, sin, qn, kn, 1e-6)
    plain = steps[1].attend(0, apply_rope(rms(q, qn, 1e-6), cos, sin), apply_rope(rms(k, kn, 1e-6), cos, sin), v)
    torch.testing.assert_close(fused, plain)
    assert not steps[0].fuses_prologue(q)              # CPU tensors: the model keeps its torch path


def test_attention_path_names():
    """Path names are read in one place: the kernel's split variants carry their count; anything else is refused
    with the valid names."""
    from trace_rl.kv.cache import KERNEL_PATH, PATHS, parse_path, reads_span, split_path

    for path in PATHS:
        assert parse_path(path) == (path, None)
    assert split_path(3) == "kernels.decode_attention:s3"
    assert parse_path(split_path(3)) == (KERNEL_PATH, 3)
    assert reads_span(split_path(2)) and reads_span("torch.sdpa_cudnn") and not reads_span(KERNEL_PATH)
    for bad in ("kernels.decode_attention:s0", "kernels.decode_attention:s", "kernels.decode_attention:x2",
                "torch.reference:s2", "torch.flash", "kernels.decode_attention:s2:s3", "kernels.decode_attention:s²"):
        with pytest.raises(ValueError, match=r"valid: kernels\.decode_attention, kernels\.decode_attention_gluon, "
                                             r"torch\.flash_varlen"):
            parse_path(bad)
    cache = PagedKVCache("bf16", 1, 4, 16, 2, 32)
    with pytest.raises(ValueError, match="unknown decode-attention path"):
        cache.decode(0, torch.zeros(1, 2, 32), torch.zeros(1, 2, dtype=torch.int32), torch.ones(1, dtype=torch.int32),
                     0.1, None, "torch.flash")


@pytest.mark.parametrize("contiguous", [False, True])
def test_no_split_candidates_without_cuda(contiguous):
    """On a CPU the candidate list is what it was: the torch reference alone, whatever the step's shape."""
    cache = PagedKVCache("bf16", 1, 4, 16, 2, 32)
    assert cache.candidates(contiguous) == cache.candidates(contiguous, 100, 4608, 8448) == ["torch.reference"]


def test_split_path_divides_the_span(rng, monkeypatch):
    """A split variant runs the kernel with its count over the span's pages (block table narrowed: the splits
    divide the live context, not the table's capacity), and gives the reference."""
    from trace_rl import kernels

    device = "cuda" if torch.cuda.is_available() else "cpu"       # CPU: the kernel in Triton's interpreter
    batch, pages, block = 3, 20, 16
    cache, table, _ = _filled_cache("bf16", rng, device, torch.bfloat16, batch=batch, pages=pages, block=block)
    lens = torch.tensor([200, 1, 77], dtype=torch.int32, device=device)
    q = torch.randn(batch, 6, 32, generator=rng).to(device, torch.bfloat16)
    calls = []
    real = kernels.decode_attention

    def spy(q, k, v, block_table, seq_lens, scale, splits=None):
        calls.append((tuple(block_table.shape), splits))
        return real(q, k, v, block_table, seq_lens, scale, splits=splits)

    monkeypatch.setattr(kernels, "decode_attention", spy)
    got = cache.decode(0, q, table, lens, 32 ** -0.5, None, "kernels.decode_attention:s2", span=208)
    whole = cache.decode(0, q, table, lens, 32 ** -0.5, None, "kernels.decode_attention")
    assert calls == [((batch, 13), 2), ((batch, pages), None)]
    want = decode_attention_reference(q, cache.k[0], cache.v[0], table, lens, 32 ** -0.5)
    for out in (got, whole):
        torch.testing.assert_close(out.float(), want.float(), rtol=2e-2, atol=2e-2)
    with pytest.raises(ValueError, match="splits the step's span; pass span"):
        cache.decode(0, q, table, lens, 32 ** -0.5, None, "kernels.decode_attention:s2")
