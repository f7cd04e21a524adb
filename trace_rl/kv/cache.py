"""`PagedKVCache`: every layer's K and V as `PagedKV` pages in the plan's KV format, and `KVStep`, the
per-forward view the model's attention calls (`kv.attend(layer, q, k, v)`).

Numerics (the same in prefill, decode and the trainer's aligned mode): K/V are quantized per token and
head when written, and attention always reads back what was written. Prefill writes the prompt's K/V,
reads those slots back (dequantized) and runs causal SDPA over them; decode writes the new token and
attends over the cache. So a prompt token's K/V carries the same quantization error whether it is read
in prefill, in decode, or fake-quantized by the aligned trainer.

Paths, chosen once per cache and reported (`paths`), never silently:
- write: `kernels.kv_write` (GPU, when `trace_rl.kernels` provides it) or `torch.write_reference`.
- decode attention: `kernels.decode_attention` (GPU, any format, any block table); for a bf16 cache on a
  GPU whose pages are slot-contiguous also `torch.flash_varlen`, and SDPA over a static span of every
  slot with a length mask (`torch.sdpa_cudnn`: cuDNN's kernel; `torch.sdpa_masked`: SDPA's choice;
  `torch.efficient_varlen` on request); `torch.reference` (gather + dequantize) on CPU. `candidates()`
  lists what can run; the engine measures them and picks per batch and context (`KVStep.attention`).
  For a bf16 cache on a GPU it also lists split-count variants of the kernel, `kernels.decode_attention:s<N>`
  (`parse_path`): N splits of the step's span (the context bucket, which bounds every length) rather than of
  the block table's capacity, where N is not the launcher's own choice (`attention_config.split_variants`).
- `kernels.decode_attention_gluon` (`trace_rl.kv.gluon`): the Gluon kernel (sm_90, Triton 3.6) over nvfp4 or
  mxfp4 caches of head_dim 128 in 64-token pages; forced by attention="gluon" (an error where it cannot run, naming
  why); under "auto" a candidate where it can run (`gluon.GLUON_IN_AUTO`, set), left out where it cannot.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass

import torch

from trace_rl.formats.paged_kv import DEFAULT_BLOCK_SIZE, PagedKV
from trace_rl.kv import decode_attention as attn
from trace_rl.kv import gluon
from trace_rl.kv.causal import causal_attention
from trace_rl.op_ranges import op_range

log = logging.getLogger("trace_rl.kv")

# Tokens per page by KV format (the engine's default `block_size`): the decode kernel's tile for the quantized
# formats (their pages must be a multiple of 16 tokens), 16 for bf16 (formats/paged_kv.DEFAULT_BLOCK_SIZE).
PAGE_SIZE = dict(DEFAULT_BLOCK_SIZE)


def default_page_size(kv_format: str) -> int:
    return PAGE_SIZE.get(kv_format, 16)


ATTENTION_CHOICES = ("auto", "kernels", "gluon", "flash_varlen", "efficient_varlen", "sdpa_masked", "sdpa_cudnn",
                     "reference")
# Paths that need slot-contiguous pages (row b's pages are b*P .. b*P+P-1, `KVStep.capacity` set).
CONTIGUOUS_ONLY = ("torch.flash_varlen", "torch.efficient_varlen", "torch.sdpa_masked", "torch.sdpa_cudnn")
# Paths that read a static span of every slot (the step's longest context, rounded up: `KVStep.span`).
SPAN_PATHS = ("torch.sdpa_masked", "torch.sdpa_cudnn")
KERNEL_PATH = "kernels.decode_attention"
GLUON_PATH = gluon.GLUON_PATH
# Every path's name, from the choices that force it (attention="kernels": KERNEL_PATH, "gluon": GLUON_PATH; the
# others: torch.<choice>)
PATHS = (KERNEL_PATH, GLUON_PATH,
         *(f"torch.{c}" for c in ATTENTION_CHOICES if c not in ("auto", "kernels", "gluon")))
SPLIT_MARK = ":s"                  # KERNEL_PATH + ":s3": the kernel with 3 splits of the step's span


def split_path(splits: int) -> str:
    return f"{KERNEL_PATH}{SPLIT_MARK}{splits}"


@functools.cache
def parse_path(path: str) -> tuple[str, int | None]:
    """(path, split count) of a decode-attention path name: ("kernels.decode_attention", 3) for
    "kernels.decode_attention:s3", (path, None) for the others. The one place path names are read."""
    if path in PATHS:
        return path, None
    base, mark, count = path.partition(SPLIT_MARK)
    if base == KERNEL_PATH and mark and count.isascii() and count.isdigit() and int(count) >= 1:
        return base, int(count)
    raise ValueError(f"unknown decode-attention path {path!r}; valid: {', '.join(PATHS)}, or "
                     f"{KERNEL_PATH}{SPLIT_MARK}N (N >= 1 splits of the step's span)")


def reads_span(path: str) -> bool:
    """Whether the path needs the step's span (`KVStep.span`): the SDPA paths read it, split variants divide it."""
    return path in SPAN_PATHS or parse_path(path)[1] is not None


def _kernels():
    """trace_rl.kernels if it provides the KV-cache kernels and can run here, else None (and why)."""
    try:
        from trace_rl import kernels
    except ImportError as err:  # pragma: no cover - the package always exists
        return None, f"trace_rl.kernels does not import: {err}"
    needed = ("kv_write", "decode_attention", "available")
    if not all(hasattr(kernels, n) for n in needed):
        return None, "trace_rl.kernels provides no kv_write/decode_attention yet"
    ok, reason = kernels.available()
    if not ok:
        return None, f"trace_rl.kernels unavailable: {reason}"
    return kernels, ""


class PagedKVCache:
    def __init__(self, kv_format: str, num_layers: int, num_blocks: int, block_size: int, kv_heads: int,
                 head_dim: int, device: torch.device | str = "cpu", dtype: torch.dtype = torch.bfloat16,
                 attention: str = "auto", query_heads: int | None = None):
        """`query_heads`: the model's query heads (the Gluon path checks its GQA group; None: per call)."""
        if attention not in ATTENTION_CHOICES:
            raise ValueError(f"attention={attention!r}; choose one of {', '.join(ATTENTION_CHOICES)}")
        self.kv_format, self.block_size, self.dtype = kv_format, block_size, dtype
        self.device = torch.device(device)
        self.query_heads = query_heads
        self._gluon_why: str | None = None          # `gluon_refusal`, worked out on first use
        if attention == "gluon":       # before allocating: a refusal costs nothing
            gluon.check(kv_format, block_size, head_dim, kv_heads, query_heads, self.device, dtype)
        self.k = [PagedKV.allocate(kv_format, num_blocks, block_size, kv_heads, head_dim, self.device, dtype)
                  for _ in range(num_layers)]
        self.v = [PagedKV.allocate(kv_format, num_blocks, block_size, kv_heads, head_dim, self.device, dtype,
                                   role="v") for _ in range(num_layers)]   # V is stored transposed per page
        self.write_path, self.attention_path, why = self._choose_paths(attention)
        self.forced = attention != "auto"
        self.paths = {"kv_write": self.write_path, "decode_attention": self.attention_path}
        log.info("KV cache %s: write=%s attention=%s%s", kv_format, self.write_path, self.attention_path,
                 f" ({why})" if why else "")
        self.why = why

    def _choose_paths(self, attention: str) -> tuple[str, str, str]:
        on_gpu = self.device.type == "cuda"
        kernels, why = _kernels() if on_gpu else (None, "CPU")
        write = "kernels.kv_write" if kernels is not None else "torch.write_reference"
        self._kernels_ok = kernels is not None
        if attention in ("kernels", "gluon"):
            if kernels is None:
                raise RuntimeError(f"attention={attention!r} requested but {why}")
            return write, KERNEL_PATH if attention == "kernels" else GLUON_PATH, ""
        if attention != "auto":
            if f"torch.{attention}" in CONTIGUOUS_ONLY and (not on_gpu or self.kv_format != "bf16"):
                raise ValueError(f"attention={attention!r} needs a bf16 KV cache on a GPU")
            return write, f"torch.{attention}", ""
        if kernels is not None:   # the default until the engine measures the candidates (`candidates`)
            return write, KERNEL_PATH, ""
        if on_gpu and self.kv_format == "bf16":
            return write, "torch.efficient_varlen", why
        if on_gpu:
            why += "; quantized KV on GPU falls back to the torch reference (gathers and dequantizes the whole " \
                   "cache every step: slow)"
            log.warning("KV cache %s on GPU without kernels: %s", self.kv_format, why)
        return write, "torch.reference", why

    def candidates(self, contiguous: bool, batch: int | None = None, span: int | None = None,
                   capacity: int | None = None) -> list[str]:
        """Decode-attention paths that can run on this cache (the engine times them per batch and length
        when attention='auto'); `contiguous`: the block tables give each row its own contiguous pages. Given
        the step's `batch`, `span` (every length <= span) and the block tables' `capacity` (tokens), on a GPU
        also the kernel's split variants worth timing there (`attention_config.split_variants`)."""
        if self.forced:
            return [self.attention_path]
        out = [KERNEL_PATH] if self._kernels_ok else []
        if out and self.device.type == "cuda" and None not in (batch, span, capacity):
            from trace_rl.kernels.attention_config import split_variants

            span = min(capacity, -(-span // self.block_size) * self.block_size)      # whole pages
            sms = torch.cuda.get_device_properties(self.device).multi_processor_count
            out += [split_path(s) for s in split_variants(self.k[0].kv_format, batch, self.k[0].heads, capacity,
                                                          span, sms)]
        if out and gluon.GLUON_IN_AUTO and self.gluon_ok():
            out.append(GLUON_PATH)
        if self.device.type == "cuda" and self.kv_format == "bf16" and contiguous:
            # efficient_varlen ran 1.5x slower than these at every measured shape (H200, docs/engine.md)
            out += ["torch.flash_varlen", "torch.sdpa_cudnn", "torch.sdpa_masked"]
        return out or [self.attention_path]

    def gluon_refusal(self) -> str:
        """Why `GLUON_PATH` cannot run on this cache ("" when it can; `trace_rl.kv.gluon`)."""
        if self._gluon_why is None:
            k = self.k[0]
            self._gluon_why = (gluon.why_not(self.kv_format, self.block_size, k.head_dim, k.heads, self.query_heads,
                                             self.device, self.dtype)
                               or ("" if self._kernels_ok else "no KV-cache kernels here (kv_write)"))
        return self._gluon_why

    def gluon_ok(self) -> bool:
        return not self.gluon_refusal()

    # -- sizes --
    @property
    def nbytes(self) -> int:
        return sum(c.nbytes for c in self.k + self.v)

    def bytes_per_token(self) -> float:
        """Bytes one token occupies over all layers, K and V."""
        return sum(c.bytes_per_token() for c in self.k + self.v)

    # -- operations --
    def write(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        if self.write_path == "kernels.kv_write":
            from trace_rl import kernels

            kernels.kv_write(self.k[layer], slots, k)
            kernels.kv_write(self.v[layer], slots, v)
        else:
            self.k[layer].write_reference(slots, k)
            self.v[layer].write_reference(slots, v)

    def read(self, layer: int, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.k[layer].read_reference(slots), self.v[layer].read_reference(slots)

    def decode(self, layer: int, q: torch.Tensor, block_table: torch.Tensor, seq_lens: torch.Tensor,
               scale: float, capacity: int | None, path: str | None = None, span: int | None = None) -> torch.Tensor:
        k, v = self.k[layer], self.v[layer]
        path, splits = parse_path(path or self.attention_path)
        if path == KERNEL_PATH:
            from trace_rl import kernels

            if splits is not None:        # a split variant divides the span: the table's pages that can be live
                if span is None:
                    raise ValueError(f"{path}{SPLIT_MARK}{splits} splits the step's span; pass span (KVStep.span)")
                block_table = block_table[:, : -(-span // self.block_size)]
            return kernels.decode_attention(q, k, v, block_table, seq_lens, scale, splits=splits)
        if path == GLUON_PATH:
            from trace_rl import kernels

            return kernels.decode_attention_gluon(q, k, v, block_table, seq_lens, scale)
        if path in CONTIGUOUS_ONLY and capacity is None:
            raise ValueError(f"{path} needs slot-contiguous pages (KVStep.capacity); this step's block tables "
                             f"are a shared pool")
        if path == "torch.flash_varlen":
            return attn.flash_varlen(q, k, v, seq_lens, scale, capacity)
        if path == "torch.efficient_varlen":
            return attn.efficient_varlen(q, k, v, seq_lens, scale, capacity)
        if path == "torch.sdpa_masked":
            return attn.sdpa_masked(q, k, v, seq_lens, scale, capacity, span)
        if path == "torch.sdpa_cudnn":
            return attn.sdpa_masked(q, k, v, seq_lens, scale, capacity, span, backend="cudnn")
        return attn.reference(q, k, v, block_table, seq_lens, scale)

    @torch.no_grad()
    def copy_pages(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Copy whole pages (every layer, K and V, codes and scales): prompt K/V shared by a group's samples."""
        for cache in self.k + self.v:
            for t in (cache.codes, cache.scales, cache.global_scale):
                if t is not None:
                    t[dst] = t[src]


@dataclass
class KVStep:
    """What one forward writes and reads: flat `slots` [B, T] of the new tokens, `block_table` [B, pages],
    `seq_lens` [B] after the write. `capacity` (tokens per slot) is set when row b's pages are the
    contiguous range b*P .. b*P+P-1 (the native engine's layout), which the fast bf16 paths need."""

    cache: PagedKVCache
    slots: torch.Tensor
    block_table: torch.Tensor
    seq_lens: torch.Tensor
    prefill: bool
    capacity: int | None = None
    attention: str | None = None          # decode-attention path (None: the cache's default)
    span: int | None = None               # `reads_span` paths: positions of each slot they read (>= every seq_len)

    def fuses_prologue(self, q: torch.Tensor) -> bool:
        """Whether `attend_prologue` runs as one kernel here: a decode step on the GPU with the kernels'
        `qk_norm_rope_kv_write` (q/k-norm + RoPE + K/V write) available and used for this cache's writes."""
        if self.prefill or not q.is_cuda or self.cache.write_path != "kernels.kv_write":
            return False
        from trace_rl import kernels

        return hasattr(kernels, "qk_norm_rope_kv_write")

    def attend_prologue(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cos: torch.Tensor,
                        sin: torch.Tensor, q_norm: torch.Tensor | None, k_norm: torch.Tensor | None,
                        eps: float) -> torch.Tensor:
        """`attend` for q/k/v [B, 1, H, D] straight from the projection: q/k RMSNorm (weights given), RoPE
        (cos/sin [B, 1, D]) and the K/V write in one kernel, then decode attention (`fuses_prologue`)."""
        from trace_rl import kernels

        with op_range("prologue"):
            qr = kernels.qk_norm_rope_kv_write(q[:, 0], k[:, 0], v[:, 0], cos[:, 0], sin[:, 0], self.cache.k[layer],
                                               self.cache.v[layer], self.slots.reshape(-1), q_norm, k_norm, eps)
        with op_range("attention"):
            out = self.cache.decode(layer, qr, self.block_table, self.seq_lens, q.shape[-1] ** -0.5, self.capacity,
                                    self.attention, self.span)
        return out.unsqueeze(1)

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        b, t, hkv, d = k.shape
        flat = self.slots.reshape(-1)
        with op_range("kv_write"):
            self.cache.write(layer, flat, k.reshape(b * t, hkv, d).contiguous(), v.reshape(b * t, hkv, d).contiguous())
        scale = d ** -0.5
        if self.prefill:   # attend over what was written (quantized K/V read back), from position 0
            with op_range("attention"):
                kr, vr = self.cache.read(layer, flat)
                return causal_attention(q, kr.view(b, t, hkv, d).to(q.dtype), vr.view(b, t, hkv, d).to(q.dtype),
                                        scale)
        if t != 1:
            raise ValueError(f"decode takes one new token per sequence, got {t}")
        with op_range("attention"):
            out = self.cache.decode(layer, q[:, 0], self.block_table, self.seq_lens, scale, self.capacity,
                                    self.attention, self.span)
        return out.unsqueeze(1)
