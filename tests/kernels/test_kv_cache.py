"""KV-cache write kernel against PagedKV.write_reference (bit for bit), random slots, odd sizes."""

import pytest
import torch

from trace_rl.formats.paged_kv import KV_FORMATS, PagedKV
from trace_rl.kernels import kv_write

pytestmark = pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")


def _same(a: torch.Tensor | None, b: torch.Tensor | None) -> bool:
    if a is None or b is None:
        return a is b
    view = torch.uint8 if a.dtype in (torch.float8_e4m3fn,) else a.dtype
    return a.dtype == b.dtype and torch.equal(a.cpu().view(view), b.view(view))


@pytest.mark.parametrize("kv_format", KV_FORMATS)
@pytest.mark.parametrize("T,H,D", [(1, 1, 64), (5, 3, 128), (19, 2, 32)])
def test_kv_write_matches_reference(kv_format, T, H, D, device, gen):
    blocks, page = 4, 8
    ref = PagedKV.allocate(kv_format, blocks, page, H, D)
    cache = PagedKV.allocate(kv_format, blocks, page, H, D, device=device)
    slots = torch.randperm(blocks * page, generator=gen)[:T]
    x = (torch.randn(T, H, D, generator=gen) * torch.exp(torch.randn(T, H, 1, generator=gen) * 2)).to(torch.bfloat16)
    x[0, 0, :5] = 0.0
    ref.write_reference(slots, x)
    kv_write(cache, slots.to(device), x.to(device))
    for name in ("codes", "scales", "global_scale"):
        assert _same(getattr(cache, name), getattr(ref, name)), f"{kv_format}: {name} differs"


def test_kv_write_rejects_wrong_shapes(device):
    cache = PagedKV.allocate("nvfp4", 2, 4, 2, 32, device=device)
    with pytest.raises(ValueError, match="heads"):
        kv_write(cache, torch.zeros(1, dtype=torch.int64, device=device), torch.zeros(1, 3, 32, device=device))
