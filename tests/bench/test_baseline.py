"""The plain PyTorch decode step (`trace_rl.bench.baseline`): the `torch.compile`d variant computes what the
eager one does (logits and the cache append), at B = 1 and at two larger batches (the dynamic-batch compile)."""

from __future__ import annotations

import pytest
import torch

from trace_rl.bench.baseline import PlainDecode, layer_functions
from trace_rl.models import preset

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _kv(base: PlainDecode) -> list[torch.Tensor]:
    return [lw[n].clone() for lw in base.layers for n in ("k", "v")]


def test_compiled_plain_step_equals_eager():
    c = preset("tiny")
    for batch in (1, 3, 5):
        eager = PlainDecode.random(c, batch, 40, device="cpu", dtype=torch.float32, seed=batch)
        compiled = PlainDecode.random(c, batch, 40, device="cpu", dtype=torch.float32, seed=batch)
        before = _kv(eager)
        for length in (9, 17):
            want = eager.run(length, "default", "eager")
            got = compiled.run(length, "default", "compiled")
            assert torch.isfinite(want).all()
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        assert compiled.compile_s is not None and compiled.compile_s >= 0
        after_e, after_c = _kv(eager), _kv(compiled)
        for b, e, k in zip(before, after_e, after_c, strict=True):
            torch.testing.assert_close(k, e, rtol=1e-5, atol=1e-5)
            changed = (e != b).any(dim=(0, 1, 3)).nonzero().flatten().tolist()
            assert changed == [8, 16]            # the new token's K/V written at position L-1, nothing else


def test_unknown_variant_is_rejected():
    with pytest.raises(ValueError, match="unknown plain-step variant 'fast'"):
        layer_functions("fast")
