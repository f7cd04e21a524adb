"""The trainer's fake quantization: forward = the format's quantize-dequantize, backward = straight-through.

Which implementation runs is reported in the backend's `paths` (first use logged at INFO), never silent:

- `<backend>.fake_quantize[.guided].triton`: CUDA tensors whose format has a kernel
  (`trace_rl.kernels.fake_quant`: one kernel per tensor, one read and one write, bit-exact with the
  reference; `.guided` reads the rollout's record instead of computing amaxes).
- `<backend>.fake_quantize[.guided].reference`: the torch reference (`get_format(fmt).fake_quantize`,
  `correction.guided.guided_quantize`): CPU tensors, formats or dtypes without a kernel (the reason is
  logged once per (format, dtype, why)).

The gradient is straight-through, exactly as before: backward returns the incoming gradient unchanged
(no clipping, no kernel, nothing saved for backward).

Two trainer-step savings, both exact (the same values as computing again):

- **Weights once per optimizer step** (`WeightCache`): a weight's fake-quantized copy is cached against
  the parameter's version counter, which every in-place update bumps (optimizer steps, `load_state_dict`,
  `copy_` under no_grad), so micro-batches and forwards between two steps reuse it. `paths` counts
  `<backend>.fake_quantize_weight.<impl>` once per quantization and `...weight.cached` per reuse. Edits
  through `.data` bypass the version counter: call `backend.weight_cache.clear()` after those.
- **One input, one quantization** (`_LastInput`): q/k/v (and gate/up) read the same input tensor; the
  second and third calls with the same tensor object, version, format and record get the first call's
  output (the same autograd node, so gradients still add up in x).
"""

from __future__ import annotations

import logging
import weakref

import torch
from torch.utils.weak import WeakIdKeyDictionary

from trace_rl.formats import get_format, per_token

log = logging.getLogger("trace_rl.backends")


class _StraightThrough(torch.autograd.Function):
    """Forward: the given quantized value, exactly. Backward: the incoming gradient unchanged."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, quantized: torch.Tensor) -> torch.Tensor:  # noqa: ARG004
        return quantized

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad, None


def straight_through(x: torch.Tensor, quantized: torch.Tensor) -> torch.Tensor:
    return _StraightThrough.apply(x, quantized.to(x.dtype))


_logged_reasons: set[tuple] = set()


def kernel_unavailable(x: torch.Tensor, fmt: str, record=None) -> str:
    """'' when the fused kernel runs for this call, else why not (the reference runs instead)."""
    if not x.is_cuda:
        return "CPU tensor: the torch reference runs on CPU"
    from trace_rl.kernels import available, interpreting

    if interpreting():
        return "TRITON_INTERPRET=1 is set (the interpreter runs CPU tensors only)"
    ok, why = available()
    if not ok:
        return why
    if record is not None and not record.scales.is_cuda:
        return "the guidance record is on the host; move it to the GPU first (GuidanceRecord.to)"
    from trace_rl.kernels.fake_quant import supports

    return supports(x, fmt, record)


def _note(path: str, fmt: str, x: torch.Tensor, why: str) -> None:
    key = (path, fmt, x.dtype, why)
    if x.is_cuda and key not in _logged_reasons:
        _logged_reasons.add(key)
        log.info("%s for %s (%s): %s", path, fmt, x.dtype, why)


def fake_quantize_values(x: torch.Tensor, fmt: str, record=None) -> tuple[torch.Tensor, str]:
    """(quantize-dequantized x in x's dtype, 'triton' | 'reference'); `fmt` is the exact per-row format."""
    why = kernel_unavailable(x, fmt, record)
    if not why:
        from trace_rl.kernels.fake_quant import fake_quantize

        return fake_quantize(x, fmt, record), "triton"
    if record is not None:
        from trace_rl.correction.guided import guided_quantize

        return guided_quantize(x, record, fmt).to(x.dtype), "reference"
    return get_format(fmt).fake_quantize(x), "reference"


class _LastInput:
    """The last activation fake-quantized, so that layers sharing an input quantize it once."""

    def __init__(self):
        self.key = None
        self.x = self.out = None

    def get(self, x: torch.Tensor, key: tuple) -> torch.Tensor | None:
        if self.key != key or self.x is None or self.x() is not x:
            return None
        out = self.out()
        return out

    def put(self, x: torch.Tensor, key: tuple, out: torch.Tensor) -> None:
        self.key, self.x, self.out = key, weakref.ref(x), weakref.ref(out)


def _record_key(record) -> tuple:
    if record is None:
        return ()
    return tuple(id(t) for t in (record.scales, record.global_scale, record.bits, record.valid))


def fake_quantize_activation(backend, x: torch.Tensor, fmt: str, record=None) -> torch.Tensor:
    """`Backend.fake_quantize`: x quantize-dequantized per token in per_token(fmt), straight-through."""
    fmt = per_token(fmt)
    key = (x._version, fmt, _record_key(record), torch.is_grad_enabled(), x.requires_grad)
    out = backend._last_input.get(x, key)
    if out is not None:
        return out
    values, impl = fake_quantize_values(x.detach(), fmt, record)
    path = f"{backend.name}.fake_quantize{'.guided' if record is not None else ''}.{impl}"
    if impl == "reference":
        _note(path, fmt, x, kernel_unavailable(x, fmt, record))
    backend.paths.record(path)
    out = straight_through(x, values)
    backend._last_input.put(x, key, out)
    return out


class WeightCache:
    """Fake-quantized weights keyed by the parameter (weakly), valid while its version counter and
    storage are unchanged. `quantizations` counts the quantizations done (the test of 'once per step')."""

    def __init__(self):
        self._entries = WeakIdKeyDictionary()
        self.quantizations = 0

    def get(self, w: torch.Tensor, fmt: str) -> tuple[torch.Tensor | None, tuple]:
        key = (w._version, w.data_ptr(), fmt, w.dtype, w.device, tuple(w.shape))
        hit = self._entries.get(w)
        return (hit[1] if hit is not None and hit[0] == key else None), key

    def put(self, w: torch.Tensor, key: tuple, wq: torch.Tensor) -> None:
        self._entries[w] = (key, wq)
        self.quantizations += 1

    def clear(self) -> None:
        self._entries = WeakIdKeyDictionary()

    def __len__(self) -> int:
        return len(self._entries)


def fake_quantize_weight(backend, w: torch.Tensor, fmt: str) -> torch.Tensor:
    """`Backend.fake_quantize_weight`: w quantize-dequantized per output row in `fmt` (once per parameter
    version), straight-through."""
    wq, key = backend.weight_cache.get(w, fmt)
    if wq is None:
        wq, impl = fake_quantize_values(w.detach(), fmt)
        path = f"{backend.name}.fake_quantize_weight.{impl}"
        if impl == "reference":
            _note(path, fmt, w, kernel_unavailable(w, fmt))
        backend.weight_cache.put(w, key, wq)
    else:
        path = f"{backend.name}.fake_quantize_weight.cached"
    backend.paths.record(path)
    return straight_through(w, wq)
