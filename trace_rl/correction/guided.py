"""TRACE rollout-guided rounding: the trainer reproduces the rollout's FP4 activation codes.

The rollout records, for each quantized activation (one row per token), its block scales (and nvfp4's
per-row global scale) and **one bit per element: the mantissa bit of the E2M1 code it chose** (the
parity of the magnitude index 0..7). The trainer divides its own activation by the rollout's step
(scale x global), clips to +-6, takes the two E2M1 magnitudes around the result (indices j and j+1;
j = 6 at the top, so |v| = 6 has candidates 4 and 6), and keeps the one whose parity is the rollout's
bit. Consecutive indices differ in parity, so exactly one candidate matches:

- if the trainer's value lies in the same interval as the rollout's, it gets the rollout's code exactly,
  whichever side of the rounding midpoint it fell (the usual cause of trainer/rollout disagreement);
- if a tiny perturbation moved it across a grid point, the parity still picks the rollout's code;
- it is never more than one grid step from the trainer's own value.

With identical inputs the guided codes equal round-to-nearest. The sign is the trainer's. A NaN step
(a rollout block that held NaN/Inf) stays NaN. Gradients are straight-through (see backends.base).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from trace_rl.data import schema as K
from trace_rl.formats import E2M1_MAGNITUDES, get_format, unpack_nibbles
from trace_rl.formats.mxfp4 import e8m0_to_float

GUIDED_FORMATS = ("nvfp4:row", "mxfp4")


@dataclass(frozen=True)
class GuidanceRecord:
    """What the rollout keeps per quantized activation row: packed, [..., K/16 or K/32] scales (uint8:
    E4M3 bits for nvfp4, E8M0 for mxfp4), [..., 1] float32 global scale (nvfp4) or None, and [..., K/8]
    uint8 mantissa bits (element 8i + b in bit b of byte i)."""

    scales: torch.Tensor
    global_scale: torch.Tensor | None
    bits: torch.Tensor
    valid: torch.Tensor | None = None   # [...] bool over rows: False rows (not recorded) round to nearest

    def bytes_per_row(self) -> int:
        per = lambda t: 0 if t is None else t.shape[-1] * t.element_size()  # noqa: E731
        return per(self.scales) + per(self.global_scale) + per(self.bits)


def _check(fmt: str) -> None:
    if fmt not in GUIDED_FORMATS:
        raise ValueError(f"guided rounding works on FP4 activations ({', '.join(GUIDED_FORMATS)}); got {fmt!r}")


def pack_bits(bits: torch.Tensor) -> torch.Tensor:
    """[..., K] of 0/1 (K a multiple of 8) -> [..., K/8] uint8, element 8i + b in bit b."""
    weights = (1 << torch.arange(8, device=bits.device, dtype=torch.int32))
    return (bits.reshape(*bits.shape[:-1], -1, 8).to(torch.int32) * weights).sum(-1).to(torch.uint8)


def unpack_bits(packed: torch.Tensor) -> torch.Tensor:
    shifts = torch.arange(8, device=packed.device, dtype=torch.int32)
    return ((packed.to(torch.int32).unsqueeze(-1) >> shifts) & 1).flatten(-2).to(torch.uint8)


def record_guidance(x: torch.Tensor, fmt: str) -> GuidanceRecord:
    """The rollout's record of quantizing x [..., K] per row in `fmt` (the torch reference)."""
    _check(fmt)
    q = get_format(fmt).quantize(x)
    mantissa = unpack_nibbles(q.codes) & 1
    scales = q.scales.view(torch.uint8) if q.scales.dtype != torch.uint8 else q.scales
    return GuidanceRecord(scales, q.global_scale, pack_bits(mantissa))


def _steps(record: GuidanceRecord, fmt: str, block: int) -> torch.Tensor:
    if fmt == "mxfp4":
        step = e8m0_to_float(record.scales)
    else:
        step = record.scales.view(torch.float8_e4m3fn).float() * record.global_scale
    return step.repeat_interleave(block, dim=-1)


def guided_quantize(x: torch.Tensor, record: GuidanceRecord, fmt: str) -> torch.Tensor:
    """x [..., K] quantize-dequantized with the rollout's scales and rounding choices (float32)."""
    _check(fmt)
    block = 16 if fmt.startswith("nvfp4") else 32
    xf = x.float()
    step = _steps(record, fmt, block)
    if step.shape != xf.shape:
        raise ValueError(f"guidance record covers shape {tuple(step.shape)}, activation is {tuple(xf.shape)}: "
                         f"the record must come from the same tokens and layer")
    v = torch.where(step == 0, xf * 0, xf / step).clamp(-6.0, 6.0)
    if record.valid is not None and not bool(record.valid.all()):
        valid = record.valid
        while valid.dim() < v.dim():        # [B, T] over rows of [B, T, K] or [B, T, H, D]
            valid = valid.unsqueeze(-1)
        plain = get_format(fmt).fake_quantize(xf)
        return torch.where(valid, _guided_values(v, record, step), plain)
    return _guided_values(v, record, step)


def _guided_values(v: torch.Tensor, record: GuidanceRecord, step: torch.Tensor) -> torch.Tensor:
    mags = torch.tensor(E2M1_MAGNITUDES, device=v.device)
    # lower index j: the largest magnitude <= |v|, capped at 6 so the pair (j, j+1) always exists
    j = (torch.searchsorted(mags, v.abs().contiguous(), right=True) - 1).clamp(0, 6)
    want = unpack_bits(record.bits).to(j.dtype)
    idx = torch.where((j & 1) == want, j, j + 1)
    value = torch.copysign(mags[idx], v) * step
    return torch.where(torch.isnan(v), v, value)


# -- the trainer side: serve a batch's records to the model's guided layers --

def guidance_record(td, site) -> GuidanceRecord:
    """The record of one site (a Linear input or a layer's K/V: an `engine.guidance.Site`) in a trajectory
    TensorDict: views of its ("guidance", "bytes")."""
    return _site_record(td.get(K.GUIDANCE_BYTES), td.get(K.GUIDANCE_VALID), site)


def _site_record(rows: torch.Tensor, valid: torch.Tensor, site) -> GuidanceRecord:
    views = site.views(rows)
    return GuidanceRecord(views["scales"], views.get("global_scale"), views["bits"], valid)


class guided_trainer:  # noqa: N801  (a context manager, used as `with guided_trainer(model, td, sites):`)
    """Within the block, the model's guided Linears (and K/V, when the KV cache is FP4) fake-quantize
    with the rollout's records in `td` (rows = td's rows, positions = its packed prompt+response).

    `sites` maps a trainer Linear name (or "<attention module name>.k" / ".v") to its `Site` (the offsets of
    its record in a token's bytes), as `NativeEngine.guidance_sites` reports it. Records held in host memory
    (the native engine's) are copied to the model's device on entry, these rows only, as one tensor (enter
    once per micro-batch), asynchronously when pinned; `h2d_bytes` says how many bytes that moved. They are
    released on exit."""

    def __init__(self, model, td, sites: dict):
        self.model, self.td, self.sites = model, td, sites
        self._hooked: list = []
        self.h2d_bytes = 0

    def _record(self, site) -> GuidanceRecord:
        """The site's record on the model's device; one object per site (q/k/v share it, so the backend
        quantizes their shared input once)."""
        if site.key not in self._records:
            self._records[site.key] = _site_record(self._rows, self._valid, site)
        return self._records[site.key]

    def __enter__(self):
        device = next(self.model.parameters()).device
        rows, valid = self.td.get(K.GUIDANCE_BYTES), self.td.get(K.GUIDANCE_VALID)
        if rows.device != device:
            rows, valid = rows.to(device, non_blocking=True), valid.to(device, non_blocking=True)
            self.h2d_bytes += rows.nbytes + valid.nbytes
        self._rows, self._valid = rows, valid
        self._records: dict[str, GuidanceRecord] = {}
        get = self._record
        for name, module in self.model.named_modules():
            if getattr(module, "trainer_mode", None) == "guided" and name in self.sites:
                record = get(self.sites[name])
                module.activation_hook = lambda layer, x, r=record: r
                self._hooked.append(module)
            if hasattr(module, "kv_hook") and f"{name}.k" in self.sites:
                k, v = (get(self.sites[f"{name}.{w}"]) for w in "kv")
                module.kv_hook = lambda attn, k_, v_, r=(k, v): r
                self._hooked.append(module)
        return self

    def __exit__(self, *exc):
        for module in self._hooked:
            if hasattr(module, "activation_hook"):
                module.activation_hook = None
            if hasattr(module, "kv_hook"):
                module.kv_hook = None
        self._hooked.clear()
        self._records = {}
        self._rows = self._valid = None
        return False
