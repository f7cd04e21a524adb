"""Paged decode attention over each KV format against a float64 reference, ragged lengths, GQA."""

import math

import pytest
import torch

from trace_rl.formats import QTensor
from trace_rl.formats.paged_kv import KV_FORMATS, PagedKV, slots_for
from trace_rl.kernels import decode_attention, decode_attention_reference, kv_write

pytestmark = pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")


def _dequant64(c: PagedKV) -> torch.Tensor:
    """Every slot's exact dequantized value, float64 [P*S, H, D]."""
    flat = lambda t: None if t is None else t.cpu().reshape(-1, *t.shape[2:])  # noqa: E731
    if c.fmt == "bf16":
        return flat(c.codes).double()
    codes = flat(c.codes)
    q = QTensor(codes, flat(c.scales), flat(c.global_scale), (*codes.shape[:-1], c.head_dim), torch.float32, c.fmt)
    return q.dequantize().double()


def _reference64(q, k, v, block_table, lens, scale):
    B, Hq, D = q.shape
    hkv = k.codes.shape[2]
    kd, vd = _dequant64(k), _dequant64(v)
    out = torch.zeros(B, Hq, D, dtype=torch.float64)
    for b in range(B):
        slots = slots_for(block_table[b : b + 1].cpu(), torch.arange(int(lens[b]))[None], k.block_size)[0]
        qb = q[b].cpu().double().reshape(hkv, Hq // hkv, D)
        p = torch.softmax(torch.einsum("hgd,lhd->hgl", qb, kd[slots]) * scale, -1)
        out[b] = torch.einsum("hgl,lhd->hgd", p, vd[slots]).reshape(Hq, D)
    return out


def _setup(kv_format, lens, hkv, group, D, page, device, gen):
    B = len(lens)
    pages_per_seq = [math.ceil(n / page) for n in lens]
    max_pages = max(pages_per_seq) + 1                       # one spare column: never read
    num_blocks = sum(pages_per_seq) + 3
    perm = torch.randperm(num_blocks, generator=gen)         # pages scattered over the cache
    block_table = torch.full((B, max_pages), 10**6, dtype=torch.int32)  # garbage beyond each sequence
    used = 0
    for b, n in enumerate(pages_per_seq):
        block_table[b, :n] = perm[used : used + n].to(torch.int32)
        used += n
    k = PagedKV.allocate(kv_format, num_blocks, page, hkv, D, device=device)
    v = PagedKV.allocate(kv_format, num_blocks, page, hkv, D, device=device)
    for b, n in enumerate(lens):
        slots = slots_for(block_table[b : b + 1].long(), torch.arange(n)[None], page)[0]
        kv_write(k, slots.to(device), (torch.randn(n, hkv, D, generator=gen) * 2).to(torch.bfloat16).to(device))
        kv_write(v, slots.to(device), torch.randn(n, hkv, D, generator=gen).to(torch.bfloat16).to(device))
    q = torch.randn(B, hkv * group, D, generator=gen).to(torch.bfloat16)
    return q, k, v, block_table, torch.tensor(lens, dtype=torch.int32)


def _rel_err(y, ref):
    return ((y.double().cpu() - ref).norm() / ref.norm()).item()


@pytest.mark.parametrize("kv_format", KV_FORMATS)
@pytest.mark.parametrize("D", [64, 128])                     # FP4 scales read as bytes / as int32 words
def test_decode_attention_matches_reference(kv_format, D, device, gen):
    lens, hkv, group, page = [1, 70, 33], 2, 3, 16           # lengths not multiples of page or tile
    q, k, v, bt, sl = _setup(kv_format, lens, hkv, group, D, page, device, gen)
    scale = D ** -0.5
    ref = _reference64(q, k, v, bt, sl, scale)
    out = decode_attention(q.to(device), k, v, bt.to(device), sl.to(device), scale)
    assert out.shape == q.shape and out.dtype == q.dtype
    assert _rel_err(out, ref) < 1e-2
    torch_ref = decode_attention_reference(q.to(device), k, v, bt.to(device), sl.to(device), scale)
    assert _rel_err(torch_ref, ref) < 1e-2


def test_decode_attention_empty_sequence_and_nan(device, gen):
    q, k, v, bt, sl = _setup("nvfp4", [0, 40], 1, 4, 32, 16, device, gen)
    out = decode_attention(q.to(device), k, v, bt.to(device), sl.to(device), 0.2).cpu()
    assert torch.equal(out[0], torch.zeros_like(out[0]))
    slot = int(bt[1, 0]) * 16 + 5                             # poison one token of sequence 1
    kv_write(k, torch.tensor([slot], device=device), torch.full((1, 1, 32), float("nan"), device=device))
    out = decode_attention(q.to(device), k, v, bt.to(device), sl.to(device), 0.2).cpu()
    assert out[1].isnan().all()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("kv_format", KV_FORMATS)
@pytest.mark.parametrize("decode", [0, 1])
def test_decode_attention_qwen_shape_gpu(kv_format, decode, gen):
    """Qwen3-8B heads (32 q, 8 kv, 128 dim), pages of 16, ragged lengths up to 3000, each decode mode."""
    from trace_rl.kernels.paged_attention import decode_attention as attn

    q, k, v, bt, sl = _setup(kv_format, [3000, 1, 517, 1024], 8, 4, 128, 16, "cuda", gen)
    ref = _reference64(q, k, v, bt, sl, 128 ** -0.5)
    out = attn(q.cuda(), k, v, bt.cuda(), sl.cuda(), 128 ** -0.5, decode=decode)
    assert _rel_err(out, ref) < 1e-2
