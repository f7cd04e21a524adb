"""`GuidanceRecorder`: the native engine's side of TRACE guided rounding.

For the plan's guided layers (`PrecisionPlan.guided_layers`: "all", "deeper_half" or a glob over Linear
names) it records, for every token the rollout runs through them — prompt tokens in prefill, each fed
response token in decode — the FP4 quantization of the layer's input (block scales, global scale, one
mantissa bit per element; see `trace_rl.correction.guided`), once per distinct input (q/k/v share one
record, gate/up another). With an FP4 KV cache it records K and V of those layers too.

**Layout.** A token's records are one row of `bytes_per_token` bytes: each site's scales, float32 global
scales (nvfp4) and packed bits at fixed 4-aligned offsets (`sites`).

**Where they go.** Records leave the GPU while the rollout runs:

- decode writes into a ring of `window` positions per slot on the GPU (`ring`, max_batch x window rows),
  at the row `decode_rows` computes on the device from the slot's token count: no Python runs per
  layer, so the decode step keeps its CUDA graph (the record kernel is captured with it);
- every `window` steps at most (the engine's loop never runs more between flushes) `flush` copies each
  occupied slot's new positions into its output row of a pinned host buffer (`host`, rows x (prompt
  width + max_new) x bytes_per_token), asynchronously, on the compute stream (stream order makes the ring
  reusable at once); prefill records go to the host rows of every sample of their prompt;
- `result` hands the host rows over as they are, already laid out as the trainer packs [prompt, response]:
  ("guidance", "bytes") [rows, width, bytes_per_token] (a view of `host`) and ("guidance", "valid"). They
  stay one tensor through the replay buffer and the trainer's micro-batches (one contiguous copy per row
  or micro-batch); a site's scales / global scales / bits are views of it (`Site.views`), cut where they
  are read. (Per-site tensors cost one strided copy per token and site wherever rows are gathered: ~10 s
  per step of the 105M study model, whose tokens carry 84 sites.)

GPU memory: the ring (max_batch x window x bytes_per_token) and one prefill chunk. Host memory: the
records of one `generate` call (`host_bytes`), freed when its TensorDict is; pinned blocks are reused by
torch's caching host allocator, so repeated steps do not grow it. PCIe traffic is reported (`stats`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from fnmatch import fnmatchcase

import torch
from tensordict import TensorDict

from trace_rl.correction.guided import GUIDED_FORMATS, record_guidance
from trace_rl.formats import per_token

# layers that read the same input (unfused rollouts keep q/k/v and gate/up apart): one record for each group
SHARED_INPUT = {"k_proj": "q_proj", "v_proj": "q_proj", "up_proj": "gate_proj"}


def select_guided_layers(names: list[str], spec: str, num_layers: int) -> list[str]:
    if spec == "all":
        return names
    if spec == "deeper_half":
        return [n for n in names if _layer_index(n) is not None and _layer_index(n) >= num_layers // 2]
    return [n for n in names if fnmatchcase(n, spec)]


def _layer_index(name: str) -> int | None:
    parts = name.split(".")
    for a, b in zip(parts, parts[1:]):
        if a == "layers" and b.isdigit():
            return int(b)
    return None


def site_key(name: str) -> str:
    return name.replace(".", "/")


def _align4(n: int) -> int:
    return (n + 3) // 4 * 4


@dataclass(frozen=True)
class Site:
    """One recorded tensor: `heads` rows of K elements per token (1 for a Linear input), in `fmt`, its
    scales / global scales / bits at byte offsets of the token's row (global_off None for mxfp4).
    `per_head`: a K/V site, whose views keep the head axis even for a model with one KV head."""

    key: str
    fmt: str
    K: int
    heads: int
    scale_off: int
    global_off: int | None
    bits_off: int
    end: int
    per_head: bool = False

    @property
    def block(self) -> int:
        return 16 if self.fmt == "nvfp4:row" else 32

    def views(self, rows: torch.Tensor) -> dict[str, torch.Tensor]:
        """scales / global_scale / bits of this site as views of byte rows [..., bytes_per_token]."""
        lead = rows.shape[:-1]
        shape = (*lead, self.heads) if self.per_head else lead
        nb, nbits = self.K // self.block, self.K // 8
        out = {"scales": rows[..., self.scale_off:self.scale_off + self.heads * nb].reshape(*shape, nb),
               "bits": rows[..., self.bits_off:self.bits_off + self.heads * nbits].reshape(*shape, nbits)}
        if self.global_off is not None:
            g = rows[..., self.global_off:self.global_off + 4 * self.heads].view(torch.float32)
            out["global_scale"] = g.reshape(*shape, 1)
        return out


def record_into(buf: torch.Tensor, dest: torch.Tensor, x: torch.Tensor, site: Site) -> None:
    """The torch reference of `kernels.fake_quant_record.record_rows`: x's record into rows `dest` of buf."""
    rec = record_guidance(x.detach().reshape(dest.numel(), site.heads, site.K), site.fmt)
    row = buf[dest]
    row[:, site.scale_off:site.scale_off + rec.scales.numel() // dest.numel()] = rec.scales.reshape(dest.numel(), -1)
    row[:, site.bits_off:site.bits_off + rec.bits.numel() // dest.numel()] = rec.bits.reshape(dest.numel(), -1)
    if site.global_off is not None:
        g = rec.global_scale.reshape(dest.numel(), -1).contiguous().view(torch.uint8)
        row[:, site.global_off:site.global_off + g.shape[1]] = g
    buf[dest] = row


class GuidanceRecorder:
    def __init__(self, model, plan, max_batch: int = 1, device: torch.device | str = "cpu", window: int = 64):
        self.model, self.window = model, int(window)
        self.device = torch.device(device)
        self.sites: dict[str, Site] = {}
        self.modules: dict[str, object] = {}               # site key -> the module whose hook records it
        self.trainer_sites: dict[str, Site] = {}           # trainer module name (+ .k/.v) -> its site
        offset = 0
        linears = {n: m for n, m in model.linears().items() if per_token(m.act_fmt) in GUIDED_FORMATS}
        chosen = select_guided_layers(list(linears), plan.guided_layers, model.config.num_layers)
        keys: dict[str, str] = {}
        for name in chosen:
            parent, _, leaf = name.rpartition(".")
            first = f"{parent}.{SHARED_INPUT[leaf]}" if leaf in SHARED_INPUT else name
            if first in keys:                               # k/v/up: the input q/gate already records
                keys[name] = keys[first]
            else:
                lin, key = linears[name], site_key(name)
                keys[name] = key
                offset = self._add(key, per_token(lin.act_fmt), lin.in_features, 1, offset, per_head=False)
                self.modules[key] = lin
            for trainer_name in (linears[name].fused_from or (name,)):
                self.trainer_sites[trainer_name] = self.sites[keys[name]]
        kv_fmt = per_token(plan.kv_cache)
        c = model.config
        if kv_fmt in GUIDED_FORMATS:
            for layer in model.model.layers:
                attn = layer.self_attn
                if plan.guided_layers == "deeper_half" and attn.layer_idx < c.num_layers // 2:
                    continue
                for which in "kv":
                    name = f"model.layers.{attn.layer_idx}.self_attn.{which}"
                    key = site_key(name)
                    offset = self._add(key, kv_fmt, c.head_dim, c.num_kv_heads, offset, per_head=True)
                    self.modules[key] = attn
                    self.trainer_sites[name] = self.sites[key]
        self.bytes_per_token = offset
        self.max_batch = max_batch
        self.dest = torch.zeros(max_batch, dtype=torch.long, device=self.device)  # ring row of each slot's token
        self.set_window(self.window)
        self.active = False
        self.host: torch.Tensor | None = None
        self.stats = {"d2h_bytes": 0, "d2h_seconds": 0.0, "host_bytes": 0, "peak_host_bytes": 0}
        self._kernels = self.device.type == "cuda" and _kernels_run_here()

    def set_window(self, window: int) -> None:
        """Positions per slot the GPU holds between flushes (a captured graph must be captured again after)."""
        self.window = int(window)
        self.ring = torch.zeros(self.max_batch * self.window, max(self.bytes_per_token, 4), dtype=torch.uint8,
                                device=self.device)
        self.target = self.ring                            # where the hooks write: the ring, or a prefill chunk

    @property
    def gpu_bytes(self) -> int:
        return self.ring.numel()

    def _add(self, key: str, fmt: str, k: int, heads: int, offset: int, per_head: bool) -> int:
        block = 16 if fmt == "nvfp4:row" else 32
        scale_off = offset
        global_off = _align4(scale_off + heads * k // block) if fmt == "nvfp4:row" else None
        bits_off = _align4(global_off + 4 * heads if global_off is not None else scale_off + heads * k // block)
        end = _align4(bits_off + heads * k // 8)
        self.sites[key] = Site(key, fmt, k, heads, scale_off, global_off, bits_off, end, per_head)
        return end

    # -- hooks (called where the rollout quantizes; they only launch the record kernel) --
    def attach(self) -> None:
        for key, site in self.sites.items():
            module = self.modules[key]
            if key.endswith("/k") or key.endswith("/v"):
                module.kv_hook = self._kv_hook
            else:
                module.activation_hook = lambda layer, x, site=site: self._store(site, x)

    def _kv_hook(self, attn, k, v) -> None:
        base = site_key(f"model.layers.{attn.layer_idx}.self_attn")
        for which, t in (("k", k), ("v", v)):
            site = self.sites.get(f"{base}/{which}")
            if site is not None:
                self._store(site, t)

    def _store(self, site: Site, x: torch.Tensor) -> None:
        if not self.active:
            return
        dest = self._dest
        if self._kernels:
            from trace_rl.kernels.fake_quant_record import record_rows

            record_rows(x, site.fmt, self.target, dest, site.heads, site.scale_off, site.global_off, site.bits_off)
        else:
            record_into(self.target, dest, x, site)

    # -- one generate call --
    def begin(self, rows: int, prompt_width: int, max_new: int) -> None:
        """Host rows for this call's records, laid out as the trainer packs [prompt, response]."""
        width = prompt_width + max_new
        pin = self.device.type == "cuda"
        self.host = torch.empty(rows, width, self.bytes_per_token, dtype=torch.uint8, pin_memory=pin)
        self.stats["host_bytes"] = self.host.numel()
        self.stats["peak_host_bytes"] = max(self.stats["peak_host_bytes"], self.host.numel())
        self.flushed: dict[int, int] = {}                  # output row -> response positions on the host
        self.active = False

    def prefill(self, tokens: int) -> None:
        """The hooks now write the next prefill's `tokens` rows (prompt-major, padded width) to a GPU chunk."""
        self.target = torch.empty(tokens, max(self.bytes_per_token, 4), dtype=torch.uint8, device=self.device)
        self._dest = torch.arange(tokens, device=self.device)
        self.active = True

    def prefill_done(self, width: int, members: list[tuple[int, int, int]]) -> None:
        """members: (index of the prompt in the chunk, output row, prompt length) of every sample of the
        chunk's prompts (the siblings that share the prefill included)."""
        chunk = self.target
        t0 = time.perf_counter()
        for i, row, plen in members:
            self._copy(self.host[row, :plen], chunk[i * width:i * width + plen])
            self.flushed[row] = 0
        self.stats["d2h_seconds"] += time.perf_counter() - t0
        self.target, self._dest, self.active = self.ring, self.dest, True

    def decode_rows(self, n: int, ngen: torch.Tensor) -> None:
        """On the device (inside the captured step): slot s feeds response token ngen[s] - 1, whose record
        goes to ring row s * window + (ngen[s] - 1) % window."""
        slot = torch.arange(n, device=ngen.device)
        self.dest[:n] = slot * self.window + (ngen[:n] - 1).clamp(min=0) % self.window
        self.target, self._dest, self.active = self.ring, self.dest[:n], True

    def flush(self, running: list[tuple[int, int, int]], steps: int, max_new: int) -> None:
        """Copy the positions the last `steps` decode steps recorded (<= window) to the host rows, for the
        running samples given as (slot, output row, prompt length). Call it before slots move or free."""
        if steps > self.window:
            raise RuntimeError(f"guidance ring holds {self.window} positions; flush every {self.window} steps")
        t0 = time.perf_counter()
        for s, row, plen in running:
            r0 = self.flushed[row]
            r1 = min(r0 + steps, max_new - 1)               # the last generated token is never fed
            r = r0
            while r < r1:                                   # at most two segments of the ring
                a = r % self.window
                m = min(r1 - r, self.window - a)
                self._copy(self.host[row, plen + r:plen + r + m],
                           self.ring[s * self.window + a:s * self.window + a + m])
                r += m
            self.flushed[row] = r1
        self.stats["d2h_seconds"] += time.perf_counter() - t0

    def _copy(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        dst.copy_(src, non_blocking=True)
        self.stats["d2h_bytes"] += src.numel()

    def end(self) -> None:
        self.active = False
        if self.device.type == "cuda":
            torch.cuda.current_stream(self.device).synchronize()   # the host rows are complete

    # -- assembly: [rows, prompt width + response width] as pack_full lays tokens out --
    def result(self, prompt_index, prompt_lens, ngen, prompt_width: int, resp_width: int) -> TensorDict:
        self.end()
        rows = prompt_index.shape[0]
        width = prompt_width + resp_width
        t = torch.arange(width)[None, :]
        plen = prompt_lens[prompt_index].cpu()[:, None]
        valid = (t < plen) | ((t >= plen) & (t - plen < ngen.cpu()[:, None] - 1))
        td = TensorDict({"bytes": self.host[:, :width], "valid": valid}, batch_size=[rows])
        self.host = None                                  # the TensorDict owns the records now
        return td


def _kernels_run_here() -> bool:
    from trace_rl.kernels import available, interpreting

    return available()[0] and not interpreting()
