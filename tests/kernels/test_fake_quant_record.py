"""The rollout's record kernel writes exactly the torch reference's bytes (`engine.guidance.record_into`):
block scales and global scales always, mantissa bits of every finite block."""

from __future__ import annotations

import pytest
import torch

from trace_rl.engine.guidance import Site, _align4, record_into
from trace_rl.kernels.fake_quant_record import record_rows

pytestmark = pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning", "ignore:divide by zero:RuntimeWarning",
                                        "ignore:overflow:RuntimeWarning")


def site(fmt: str, K: int, heads: int, offset: int = 8) -> Site:
    block = 16 if fmt == "nvfp4:row" else 32
    g = _align4(offset + heads * K // block) if fmt == "nvfp4:row" else None
    bits = _align4(g + 4 * heads if g is not None else offset + heads * K // block)
    return Site("s", fmt, K, heads, offset, g, bits, _align4(bits + heads * K // 8), per_head=heads > 1)


@pytest.mark.parametrize("fmt", ["nvfp4:row", "mxfp4"])
@pytest.mark.parametrize("shape,heads", [((5, 1, 192), 1), ((3, 7, 160 * 2), 1), ((4, 1, 3, 64), 3)])
def test_record_kernel_matches_reference(fmt, shape, heads, device, gen):
    K = shape[-1]
    if K % (16 if fmt == "nvfp4:row" else 32):
        pytest.skip("K not a multiple of the block")
    s = site(fmt, K, heads)
    x = torch.randn(*shape, generator=gen) * torch.exp(torch.randn(*shape[:-1], 1, generator=gen) * 2)
    x.view(-1, K)[0, :32] = 0.0
    x.view(-1, K)[-1, 3] = float("nan")                     # a NaN block: NaN scale, bits unspecified
    x = x.bfloat16()
    tokens = x.numel() // (K * heads)
    dest = torch.randperm(2 * tokens, generator=gen)[:tokens]   # scattered rows of a bigger buffer
    want = torch.zeros(2 * tokens, s.end + 4, dtype=torch.uint8)
    record_into(want, dest, x, s)
    got = torch.zeros_like(want, device=device)
    record_rows(x.to(device), fmt, got, dest.to(device), heads, s.scale_off, s.global_off, s.bits_off)
    got = got.cpu()
    block = s.block
    finite = torch.isfinite(x.float()).reshape(tokens, heads, K // block, block).all(-1)     # [T, H, NB]
    bits_ok = finite.repeat_interleave(block // 8, -1).reshape(tokens, -1)                 # per bits byte
    got_views, want_views = s.views(got[dest]), s.views(want[dest])
    for name in ("scales", "global_scale"):
        if name in want_views:
            assert torch.equal(got_views[name].view(torch.uint8), want_views[name].view(torch.uint8)), name
    gb, wb = s.views(got[dest])["bits"].reshape(tokens, -1), s.views(want[dest])["bits"].reshape(tokens, -1)
    assert torch.equal(gb[bits_ok], wb[bits_ok])
    untouched = torch.ones(2 * tokens, dtype=torch.bool)
    untouched[dest] = False
    assert not got[untouched].any(), "rows not named by dest were written"
