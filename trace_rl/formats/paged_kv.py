"""`PagedKV`: one layer's K (or V) cache in paged blocks, stored in a quantized format, with its reference.

The contract between the engine, the KV-write kernel and the decode-attention kernel: the cache is
`num_blocks` pages of `block_size` token slots; slot s of the flat cache is page s // block_size, row
s % block_size. A sequence's tokens live in the pages its block table lists, in order. Each slot holds
`heads` vectors of `head_dim`, quantized per token and head along head_dim with the format's per-token
variant (`formats.per_token`). The page size is the engine's choice (`DEFAULT_BLOCK_SIZE` per format:
64 tokens for the quantized formats, whose kernel tiles are 64 tokens; any multiple of 16 works).

Storage (P pages, S = block_size, H heads, D = head_dim, DV = max(D, 128), G = 16 nvfp4 / 32 mxfp4);
inside a (page, head) block the order is the decode kernel's, described in `formats/kv_layout.py`:

| format   | codes                                  | scales                         | global_scale    |
|----------|----------------------------------------|--------------------------------|-----------------|
| bf16     | [P, S, H, D] `dtype` (token-major)     | None                           | None            |
| fp8_e4m3 | K [P, H, S, D] / V [P, H, S*DV] uint8  | [P, H, S] float32 (row scale)  | None            |
| nvfp4    | K [P, H, S, D/2] / V [P, H, S*DV/2] u8 | [P, H, S*D/16] uint8 (re-enc.) | [P, H, S] fp32  |
| mxfp4    | K [P, H, S, D/2] / V [P, H, S*DV/2] u8 | [P, H, S*D/32] uint8 (re-enc.) | None            |

K keeps tokens as rows; V is stored transposed per page (V^T, head dims padded to DV rows). Both are
pure permutations of the reference codes plus a bijective re-encoding of the scale bytes:
`unshuffle()` returns the reference layout ([P, S, H, ...] codes/scales/global scale, exactly the QTensor
fields of `get_format(per_token(fmt))` quantizing the tokens), bit for bit, except that a block whose scale
is NaN has zero codes (the reference leaves them unspecified). `write_reference` is "quantize, then store
in this layout by slot"; `read_reference` dequantizes the given slots.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from trace_rl.formats import kv_layout as L
from trace_rl.formats.e2m1 import pack_nibbles, unpack_nibbles
from trace_rl.formats.qtensor import QTensor
from trace_rl.formats.registry import get_format, per_token

KV_FORMATS = L.KV_FORMATS
DEFAULT_BLOCK_SIZE = L.DEFAULT_BLOCK_SIZE
ROLES = ("k", "v")


def default_block_size(kv_format: str) -> int:
    """The page size the decode kernel is tuned for (tokens)."""
    if kv_format not in DEFAULT_BLOCK_SIZE:
        raise ValueError(f"unknown KV-cache format {kv_format!r}; allowed: {', '.join(KV_FORMATS)}")
    return DEFAULT_BLOCK_SIZE[kv_format]


@dataclass
class PagedKV:
    fmt: str                          # the per-token format name, e.g. "nvfp4:row", "fp8_e4m3:row"
    codes: torch.Tensor
    scales: torch.Tensor | None
    global_scale: torch.Tensor | None
    dtype: torch.dtype                # dtype values are dequantized to (and bf16 caches are stored in)
    role: str = "k"                   # "k" (tokens as rows) or "v" (stored transposed per page)
    block_size: int = 0
    heads: int = 0
    head_dim: int = 0

    @classmethod
    def allocate(cls, kv_format: str, num_blocks: int, block_size: int, heads: int, head_dim: int,
                 device: torch.device | str = "cpu", dtype: torch.dtype = torch.bfloat16,
                 role: str = "k") -> PagedKV:
        if kv_format not in KV_FORMATS:
            raise ValueError(f"unknown KV-cache format {kv_format!r}; allowed: {', '.join(KV_FORMATS)}")
        if role not in ROLES:
            raise ValueError(f"PagedKV role must be 'k' or 'v', got {role!r}")
        fmt = per_token(kv_format)
        P, S, H, D = num_blocks, block_size, heads, head_dim
        geom = dict(role=role, block_size=S, heads=H, head_dim=D)
        if fmt == "bf16":
            return cls(fmt, torch.zeros(P, S, H, D, device=device, dtype=dtype), None, None, dtype, **geom)
        L.check_geometry(kv_format, S, D)
        G = get_format(fmt).block_size if kv_format != "fp8_e4m3" else None
        DV = L.v_rows(D)
        u8 = dict(device=device, dtype=torch.uint8)
        if kv_format == "fp8_e4m3":
            codes = torch.zeros(P, H, S, D, **u8) if role == "k" else torch.zeros(P, H, S * DV, **u8)
            scales = torch.ones(P, H, S, device=device, dtype=torch.float32)
            return cls(fmt, codes, scales, None, dtype, **geom)
        codes = torch.zeros(P, H, S, D // 2, **u8) if role == "k" else torch.zeros(P, H, S * DV // 2, **u8)
        scales = torch.zeros(P, H, S * D // G, **u8)
        glob = torch.ones(P, H, S, device=device, dtype=torch.float32) if fmt == "nvfp4:row" else None
        return cls(fmt, codes, scales, glob, dtype, **geom)

    @property
    def kv_format(self) -> str:
        return self.fmt.split(":")[0]

    @property
    def num_blocks(self) -> int:
        return self.codes.shape[0]

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.codes, self.scales, self.global_scale)
                   if t is not None)

    def bytes_per_token(self) -> int:
        """Bytes one token occupies in this layer's cache (all heads; V^T padding rows included)."""
        return self.nbytes // (self.num_blocks * self.block_size)

    def _where(self, slots: torch.Tensor):
        slots = slots.to(self.codes.device).long()
        page, row = slots // self.block_size, slots % self.block_size
        heads = torch.arange(self.heads, device=slots.device)
        return page[:, None], heads[None, :], row

    # -- the torch reference: the spec the kernels match --
    def write_reference(self, slots: torch.Tensor, x: torch.Tensor) -> None:
        """Quantize x [T, H, D] per token and head and store token i in flat slot `slots[i]`."""
        if self.fmt == "bf16":
            self.codes.view(-1, self.heads, self.head_dim)[slots] = x.to(self.codes.dtype)
            return
        self.store(slots, get_format(self.fmt).quantize(x))

    def store(self, slots: torch.Tensor, q: QTensor) -> None:
        """Store the reference fields of T tokens (codes [T, H, ...], scales, global scale) at `slots`."""
        page, head, row = self._where(slots)
        T, H, D, S = row.shape[0], self.heads, self.head_dim, self.block_size
        if T == 0:
            return
        if self.kv_format == "fp8_e4m3":
            codes = q.codes.view(torch.uint8).reshape(T, H, D)
            scale = q.scales.reshape(T, H).float()
            bad = ((codes & 0x7F) == 0x7F).any(-1)
            self.scales[page, head, row[:, None]] = torch.where(bad, -scale, scale)
            if self.role == "k":
                self.codes[page, head, row[:, None]] = codes[..., L.k_fp8_byte_dims(D).to(codes.device)]
            else:
                self._store_v_halves(page, head, row, codes, *L.v_fp8_halves(S, L.v_rows(D)), pair=False)
            return
        G = get_format(self.fmt).block_size
        sbytes = q.scales.view(torch.uint8).reshape(T, H, D // G)
        nan = torch.isnan(q.scales.float()).reshape(T, H, D // G) if self.fmt == "nvfp4:row" else sbytes == 255
        codes = unpack_nibbles(q.codes.reshape(T, H, D // 2))
        codes = torch.where(nan.repeat_interleave(G, -1), 0, codes)            # NaN blocks: zero codes
        if self.global_scale is not None:
            self.global_scale[page, head, row[:, None]] = q.global_scale.reshape(T, H).float()
        index = (L.k_scale_index if self.role == "k" else L.v_scale_index)(S, D // G).to(row.device)
        self.scales[page[..., None], head[..., None], index[row][:, None, :]] = L.encode_scales(self.fmt, sbytes)
        if self.role == "k":
            dims = L.k_fp4_word_dims(D).to(codes.device)                           # [D/8, 2, 4]
            halves = L.twiddle(codes[..., dims])                                   # [T, H, D/8, 2]
            words = halves[..., 0] | (halves[..., 1] << 16)
            self.codes[page, head, row[:, None]] = words.contiguous().view(torch.uint8).view(T, H, D // 2)
        else:
            self._store_v_halves(page, head, row, codes, *L.v_fp4_halves(S, L.v_rows(D)), pair=True)

    def _store_v_halves(self, page, head, row, codes, half_index, dims, pair: bool) -> None:
        T, H, D = codes.shape
        DV = L.v_rows(D)
        padded = torch.zeros(T, H, DV, dtype=codes.dtype, device=codes.device)
        padded[..., :D] = codes
        dims, half_index = dims.to(codes.device)[row], half_index.to(codes.device)[row]   # [T, n, slots]
        picked = torch.gather(padded, 2, dims.view(T, 1, -1).expand(T, H, -1)).view(T, H, *dims.shape[1:])
        if pair:
            halves = L.twiddle(picked)
        else:
            halves = picked[..., 0].to(torch.int32) | (picked[..., 1].to(torch.int32) << 8)
        store16 = self.codes.view(self.num_blocks, H, -1).view(torch.int16)
        store16[page[..., None], head[..., None], half_index[:, None, :]] = halves.to(torch.int16)

    def fields(self, slots: torch.Tensor) -> QTensor:
        """The reference QTensor fields ([T, H, ...]) of the given slots, read back from the layout."""
        page, head, row = self._where(slots)
        T, H, D, S = row.shape[0], self.heads, self.head_dim, self.block_size
        shape = (T, H, D)
        if self.fmt == "bf16":
            return QTensor(self.codes.view(-1, H, D)[slots.long()], None, None, shape, self.dtype, self.fmt)
        if self.kv_format == "fp8_e4m3":
            if self.role == "k":
                stored = self.codes[page, head, row[:, None]]                   # [T, H, D] in storage order
                codes = torch.empty_like(stored)
                codes[..., L.k_fp8_byte_dims(D).to(codes.device)] = stored
            else:
                codes = self._load_v_halves(page, head, row, *L.v_fp8_halves(S, L.v_rows(D)), pair=False)
            scale = self.scales[page, head, row[:, None]].abs().unsqueeze(-1)
            return QTensor(codes.view(torch.float8_e4m3fn), scale, None, shape, self.dtype, self.fmt)
        G = get_format(self.fmt).block_size
        index = (L.k_scale_index if self.role == "k" else L.v_scale_index)(S, D // G).to(row.device)
        sbytes = L.decode_scales(self.fmt, self.scales[page[..., None], head[..., None], index[row][:, None, :]])
        scales = sbytes.view(torch.float8_e4m3fn) if self.fmt == "nvfp4:row" else sbytes
        if self.role == "k":
            words = self.codes[page, head, row[:, None]].contiguous().view(torch.int32)   # [T, H, D/8]
            halves = torch.stack([words & 0xFFFF, (words >> 16) & 0xFFFF], -1)
            codes = torch.empty(T, H, D, dtype=torch.uint8, device=words.device)
            codes[..., L.k_fp4_word_dims(D).to(words.device)] = L.untwiddle(halves)
        else:
            codes = self._load_v_halves(page, head, row, *L.v_fp4_halves(S, L.v_rows(D)), pair=True)
        glob = None
        if self.global_scale is not None:
            glob = self.global_scale[page, head, row[:, None]].unsqueeze(-1)
        return QTensor(pack_nibbles(codes), scales, glob, shape, self.dtype, self.fmt)

    def _load_v_halves(self, page, head, row, half_index, dims, pair: bool) -> torch.Tensor:
        T, H, D = row.shape[0], self.heads, self.head_dim
        DV = L.v_rows(D)
        dims, half_index = dims.to(row.device)[row], half_index.to(row.device)[row]
        store16 = self.codes.view(self.num_blocks, H, -1).view(torch.int16)
        halves = store16[page[..., None], head[..., None], half_index[:, None, :]].to(torch.int32) & 0xFFFF
        if pair:
            picked = L.untwiddle(halves)
        else:
            picked = torch.stack([halves & 0xFF, halves >> 8], -1).to(torch.uint8)
        out = torch.zeros(T, H, DV, dtype=torch.uint8, device=row.device)
        out.scatter_(2, dims.view(T, 1, -1).expand(T, H, -1), picked.view(T, H, -1))
        return out[..., :D]

    def read_reference(self, slots: torch.Tensor) -> torch.Tensor:
        """Dequantized [T, H, D] values (in `dtype`) of the given flat slots."""
        if self.fmt == "bf16":
            return self.codes.view(-1, self.heads, self.head_dim)[slots.long()].to(self.dtype)
        return self.fields(slots).dequantize().to(self.dtype)

    def unshuffle(self) -> QTensor:
        """The whole cache in the reference layout: codes [P, S, H, D/2] (or [P, S, H, D] fp8/bf16), scales
        [P, S, H, D/G] (fp8: [P, S, H, 1]), global scale [P, S, H, 1]; for tests and inspection."""
        P, S, H, D = self.num_blocks, self.block_size, self.heads, self.head_dim
        q = self.fields(torch.arange(P * S, device=self.codes.device))
        view = lambda t: None if t is None else t.reshape(P, S, H, *t.shape[2:])  # noqa: E731
        return QTensor(view(q.codes), view(q.scales), view(q.global_scale), (P, S, H, D), self.dtype, self.fmt)


def slots_for(block_table: torch.Tensor, positions: torch.Tensor, block_size: int) -> torch.Tensor:
    """Flat slot of each (sequence, position): block_table [B, max_pages], positions [B, T] -> [B, T]."""
    page = torch.gather(block_table.long(), 1, positions // block_size)
    return page * block_size + positions % block_size
