"""`NativeEngine`: our rollout engine. Prefill, then batched decode over slots with a paged, quantized KV cache.

- The engine owns a rollout copy of the model (same module tree, `Decoder.to_rollout`: packed
  QuantLinear weights in the plan's formats, fused norms and SiLU*mul on GPU); `load_weights`
  re-quantizes into those buffers in place.
- KV cache (`trace_rl.kv.PagedKVCache`) in pages of `block_size` tokens. `kv_layout="pool"` (default): a
  shared pool of pages (`PagePool`); a sequence takes pages as it grows and returns them when it ends,
  the samples of a prompt share its full prompt pages (reference-counted; the partial last page is
  copied per sample: copy-on-write at the first page they write), and when pages run out the newest
  sequence is preempted and recomputed later. `kv_layout="contiguous"`: slot s owns pages s*P ..
  s*P+P-1 (P = pages of max_seq_len): no sharing, no preemption, but the bf16 paths that need contiguous
  rows (FlashAttention / memory-efficient varlen) can run.
- Decode step over slots [0, n) (n = the batch bucket covering the occupied slots): model forward,
  sampling (`sample_with_counter`) and bookkeeping (history, stop check, advance), captured as one CUDA
  graph per (bucket, attention path, sampling parameters) on GPU; the host syncs only when a slot can
  have finished (after the steps to the earliest forced end, or every `stop_check_interval` steps when
  stop tokens are live). The scheduler (`trace_rl.engine.scheduler`) admits, preempts and harvests there.
- Attention (`attention="auto"`): where several paths can run (bf16 cache on a GPU: the kernel's split-count
  variants; contiguous layout: the torch paths), each is timed once per (batch bucket, context bucket) and the
  fastest used (with CUDA graphs: as a graph of calls over several layers, as the captured step runs it);
  `report()` says which. `attention="gluon"` forces the Gluon kernel over an nvfp4 or mxfp4 cache (sm_90, Triton 3.6;
  `trace_rl.kv.gluon`: an error naming why where it cannot run); "auto" times it beside the kernel where it can
  run (`GLUON_IN_AUTO`) and leaves it out, silently, where it cannot.
- `operand_cache=True` / `"bf16"` (opt-in): every dense FP4 linear keeps its bf16 operand, refreshed in place at weight
  sync, and decode steps of >= `DEQUANT_CUBLAS_MIN_M` rows run cuBLAS on it (`engine/operand_cache.py`); 2 bytes per
  weight element, allocated here before the KV cache (`report()["operand_cache_bytes"]`). `"fp8"` (mxfp4 W4A4
  plans): the operand as E4M3 (1 byte per element) and FP8 cuBLAS GEMMs (`kernels/operand_cache_fp8.py`).
- Seeds: noise is a hash of (seed, step, row), so a seed reproduces the samples for the same engine
  configuration (max_batch, layout and pool size decide which row and step a sample draws at).
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Mapping

import torch
from tensordict import TensorDict

from trace_rl.backends.quant_linear import fp8_sync_check, load_linear_weights
from trace_rl.data import schema as K
from trace_rl.engine.base import RolloutEngine, SamplingParams
from trace_rl.engine.cuda_graphs import DecodeGraphs, batch_buckets, bucket_for
from trace_rl.engine.guidance import GuidanceRecorder, Site
from trace_rl.engine.pages import PagePool
from trace_rl.engine.routing import RoutingRecorder
from trace_rl.engine.sampling import sample_with_counter
from trace_rl.formats.paged_kv import slots_for
from trace_rl.kv import KVStep, PagedKVCache
from trace_rl.kv.cache import default_page_size, reads_span
from trace_rl.models.decoder import Decoder, build
from trace_rl.models.loading import load_state_dict_into
from trace_rl.op_ranges import op_range
from trace_rl.plan import PrecisionPlan

log = logging.getLogger("trace_rl.engine")

KV_LAYOUTS = ("pool", "contiguous")
MAX_STOP_IDS = 64
CONTEXT_STEP = 512         # contexts share an attention choice (and a span) per 512 tokens
ATTENTION_TIME_LAYERS = 8  # graph-timed attention candidates read this many layers' caches (not one L2-hot one)


def rollout_copy(model: Decoder, plan: PrecisionPlan, device: torch.device, dtype: torch.dtype) -> Decoder:
    """The rollout form of `model` under `plan` (a new module tree; `model` is left untouched)."""
    copy = build(model.config, device=device, dtype=dtype)
    load_state_dict_into(copy, model.state_dict())
    return copy.apply_plan(plan).to_rollout()


class NativeEngine(RolloutEngine):
    # load_weights: QuantLinears are re-quantized in batches of about this many weight bytes (nvfp4's tensor amaxes
    # in one launch per batch, `load_linear_weights`); the batch's weights (stacked copies of fused parts) stay alive
    SYNC_BATCH_BYTES = 1 << 30

    def __init__(self, model: Decoder, plan: PrecisionPlan | None = None, *, max_batch: int = 64,
                 max_seq_len: int = 2048, block_size: int | None = None, device: torch.device | str | None = None,
                 dtype: torch.dtype | None = None, pad_token_id: int = K.PAD_TOKEN_ID_DEFAULT,
                 cuda_graphs: bool | None = None, attention: str = "auto", prefill_tokens: int = 16384,
                 stop_check_interval: int = 8, policy_version: int = 0, graph_buckets: list[int] | None = None,
                 record_guidance: bool | None = None, kv_layout: str = "pool", num_pages: int | None = None,
                 share_prefix: bool = True, record_routing: bool | None = None, operand_cache: bool | str = False):
        self.plan = plan or PrecisionPlan()
        src_device = next(model.buffers()).device
        self.device = torch.device(device) if device is not None else src_device
        if model.is_rollout:     # already converted (benches build it in place): adopt it
            if model.plan != self.plan:
                raise ValueError("this rollout model was built for another plan; pass its plan or a trainer model")
            self.model = model.to(self.device)
        else:
            dtype = dtype or (torch.bfloat16 if self.device.type == "cuda" else next(model.parameters()).dtype)
            self.model = rollout_copy(model, self.plan, self.device, dtype)
        self.model.eval()
        from trace_rl.engine.operand_cache import kind_of

        self.operand_cache = kind_of(operand_cache) or False     # False, "bf16" or "fp8"
        if self.operand_cache:     # before the KV cache: the caches' memory is taken first
            from trace_rl.engine.operand_cache import attach_model

            attach_model(self.model, self.plan, self.device, self.operand_cache)
        self.dtype = self.model.model.embed_tokens.weight.dtype
        c = self.model.config
        if kv_layout not in KV_LAYOUTS:
            raise ValueError(f"kv_layout={kv_layout!r}; choose one of {', '.join(KV_LAYOUTS)}")
        if stop_check_interval < 1:
            raise ValueError(f"stop_check_interval must be >= 1, got {stop_check_interval}")
        # TRACE guidance (plan.trainer == "guided"): record the rollout's FP4 rounding for the trainer. The
        # recorder lays records out per prompt and response position, so sequences are never preempted. Its
        # kernels write static buffers at rows computed on the device: the decode graphs capture them.
        record = self.plan.trainer == "guided" if record_guidance is None else record_guidance
        self.recorder = GuidanceRecorder(self.model, self.plan, max_batch, self.device) if record else None
        if self.recorder is not None:
            self.recorder.attach()
            kv_layout = "contiguous"
        self.block_size = block_size or default_page_size(self.plan.kv_cache)
        self.max_batch, self.max_seq_len, self.kv_layout = max_batch, max_seq_len, kv_layout
        self.pages_per_seq = math.ceil(max_seq_len / self.block_size)
        self.capacity = self.pages_per_seq * self.block_size
        if kv_layout == "contiguous":
            if num_pages not in (None, max_batch * self.pages_per_seq):
                raise ValueError("num_pages is set by the contiguous layout (max_batch x pages of max_seq_len)")
            num_pages = max_batch * self.pages_per_seq
        num_pages = num_pages or max_batch * self.pages_per_seq
        if num_pages < self.pages_per_seq:
            raise ValueError(f"num_pages={num_pages} cannot hold one sequence of max_seq_len={max_seq_len} "
                             f"({self.pages_per_seq} pages of {self.block_size} tokens)")
        self.pool = PagePool(num_pages, self.block_size)
        self.trash_page = num_pages       # one extra page: writes of idle slots and block-table padding land here
        self.share_prefix = share_prefix
        self.cache = PagedKVCache(self.plan.kv_cache, c.num_layers, num_pages + 1, self.block_size, c.num_kv_heads,
                                  c.head_dim, self.device, self.dtype, attention, query_heads=c.num_heads)
        self.pad_token_id, self.prefill_tokens = pad_token_id, prefill_tokens
        self.stop_check_interval, self.policy_version = stop_check_interval, policy_version
        dev, s = self.device, max_batch
        # Per-slot decode state: static buffers the CUDA graphs read and write.
        self.block_table = torch.full((s, self.pages_per_seq), self.trash_page, dtype=torch.int32, device=dev)
        if kv_layout == "contiguous":
            self.block_table.copy_(torch.arange(s * self.pages_per_seq, device=dev, dtype=torch.int32)
                                   .view(s, self.pages_per_seq))
        self.tokens = torch.full((s,), pad_token_id, dtype=torch.long, device=dev)   # token fed next step
        self.positions = torch.zeros(s, dtype=torch.long, device=dev)                # its position
        self.live = torch.zeros(s, dtype=torch.bool, device=dev)
        self.ngen = torch.zeros(s, dtype=torch.long, device=dev)                     # tokens generated so far
        self.limit = torch.ones(s, dtype=torch.long, device=dev)                     # max_new_tokens per slot
        self.slot_row = torch.zeros(s, dtype=torch.long, device=dev)                 # output row of the slot
        self.hist_tokens = torch.full((s, max_seq_len), pad_token_id, dtype=torch.long, device=dev)
        self.hist_logp = torch.zeros(s, max_seq_len, dtype=torch.float32, device=dev)
        self.stop_ids = torch.full((MAX_STOP_IDS,), -1, dtype=torch.long, device=dev)
        self.rng = torch.zeros(2, dtype=torch.long, device=dev)                       # (seed, step)
        self._rows = torch.arange(s, device=dev)
        # MoE: record the experts of every token for router replay (default on for MoE models)
        record_routing = c.is_moe if record_routing is None else record_routing
        self.routing = RoutingRecorder(self.model, max_batch, self.device) if record_routing else None
        if not all(ex.capturable(self.device, self.dtype) for ex in self.model.experts()):
            if cuda_graphs:
                raise ValueError("these experts' grouped matmul reads group bounds on the host (the per-expert "
                                 "loop: FP8 experts where fp8_grouped does not run, see GroupedQuantLinear."
                                 "fp8_why_not; FP4 experts without the Triton kernels; bf16 experts where "
                                 "torch._grouped_mm does not run): use cuda_graphs=None/False")
            if self.device.type == "cuda":
                log.info("decode runs without CUDA graphs: the experts' grouped matmul is not capturable here "
                         "(experts.loop)")
            cuda_graphs = False
        use_graphs = self.device.type == "cuda" if cuda_graphs is None else cuda_graphs
        if use_graphs and self.device.type != "cuda":
            raise ValueError("cuda_graphs=True needs a CUDA device")
        self.buckets = sorted(graph_buckets or batch_buckets(max_batch))
        if max(self.buckets) != max_batch:
            raise ValueError(f"graph_buckets {self.buckets} must include max_batch={max_batch}")
        self.graphs = DecodeGraphs() if use_graphs else None
        self.attention_choice: dict[tuple[int, int], dict] = {}
        self.recapture_after_load = any("emulated" in lin.quant.backend.available(self.device).path
                                        for lin in self.model.linears().values())
        self.stats = {"prefill_tokens": 0, "decode_steps": 0, "decode_rows": 0, "generated_tokens": 0,
                      "preemptions": 0, "shared_prompt_pages": 0, "peak_pages": 0}

    # -- reporting --
    def report(self) -> dict:
        """Which implementation each part ran (linear paths per backend, KV write, attention, graphs)."""
        backends = {lin.quant.backend.name: lin.quant.backend for lin in self.model.linears().values()}
        for ex in self.model.experts():
            backends.update({g.backend.name: g.backend for g in ex.grouped_linears().values()})
        chosen = {f"B{n}/L{length}": c["path"] for (n, length), c in sorted(self.attention_choice.items())}
        return {"plan": self.plan.label, "linear": {n: b.paths.summary() for n, b in backends.items()},
                "kv": dict(self.cache.paths), "kv_note": self.cache.why, "attention_chosen": chosen,
                "attention_timings": {f"B{n}/L{length}": c["ms"] for (n, length), c in
                                      sorted(self.attention_choice.items())},
                "cuda_graphs": self.graphs is not None, "graph_keys": len(self.graphs.graphs) if self.graphs else 0,
                "graph_capture_s": self.graphs.capture_s if self.graphs else 0.0, "buckets": self.buckets,
                "max_batch": self.max_batch, "kv_layout": self.kv_layout, "page_size": self.block_size,
                "num_pages": self.pool.num_pages, "kv_cache_bytes": self.cache.nbytes,
                "operand_cache": bool(self.operand_cache), "operand_cache_kind": self.operand_cache or None,
                "operand_cache_kinds": self._operand_cache_kinds(), "operand_cache_bytes": self._operand_cache_bytes(),
                "fused": {"norm": self.model.model.norm.fused and self.device.type == "cuda",
                          "silu_mul": any(getattr(layer.mlp, "fused", False) for layer in self.model.model.layers)
                          and self.device.type == "cuda",
                          "sampling": "kernels.sample_tokens" if self.device.type == "cuda" else "torch.reference"},
                "guidance_bytes_per_token": self.recorder.bytes_per_token if self.recorder else 0,
                "routing_bytes_per_token": self.routing.bytes_per_token if self.routing else 0,
                "guidance": dict(self.recorder.stats) if self.recorder else {}, **self.stats}

    def _operand_cache_kinds(self) -> dict[str, int]:
        from trace_rl.engine.operand_cache import kinds

        return kinds(self.model) if self.operand_cache else {}

    def _operand_cache_bytes(self) -> int:
        from trace_rl.engine.operand_cache import model_bytes

        return model_bytes(self.model) if self.operand_cache else 0

    @property
    def guidance_sites(self) -> dict[str, Site]:
        """Trainer module name (Linear, or '<attention>.k'/'.v') -> its record's `Site` (where it sits in each
        token's ("guidance", "bytes"))."""
        return dict(self.recorder.trainer_sites) if self.recorder else {}

    # -- weights --
    @torch.no_grad()
    def load_weights(self, state_dict: Mapping[str, torch.Tensor], version: int) -> None:
        """Re-quantize trainer weights into the existing buffers (no reallocation: graphs stay valid)."""
        sd = dict(state_dict)
        tied = self.model.config.tie_word_embeddings
        expected = set()

        def take(key: str) -> torch.Tensor:
            if key == "lm_head.weight" and tied and key not in sd:
                key = "model.embed_tokens.weight"
            if key not in sd:
                raise KeyError(f"load_weights: {key} missing from the state dict")
            expected.add(key)
            return sd[key].to(self.device)

        batch, held = [], 0     # QuantLinears loaded together: nvfp4's tensor amaxes in one launch per batch
        with fp8_sync_check():  # FP8 operand caches: one exactness read for the whole sync, naming every bad weight
            for name, lin in self.model.linears().items():
                parts = lin.fused_from or (name,)          # a fused rollout layer stacks its parts' weights
                weight = torch.cat([take(f"{p}.weight") for p in parts])
                bias = torch.cat([take(f"{p}.bias") for p in parts]) if lin.quant.bias is not None else None
                batch.append((lin.quant, weight, bias))
                held += weight.nbytes
                if held >= self.SYNC_BATCH_BYTES:          # bounds the weights (and stacked copies) alive at once
                    load_linear_weights(batch)
                    batch, held = [], 0
            load_linear_weights(batch)
        for experts in self.model.experts():
            experts.load_weight(take(f"{experts.name}.gate_up_proj"), take(f"{experts.name}.down_proj"))
        for name, p in self.model.named_parameters():
            if name not in sd:
                raise KeyError(f"load_weights: {name} missing from the state dict")
            p.copy_(sd[name])
            expected.add(name)
        unexpected = sorted(set(sd) - expected - {"lm_head.weight"})
        if unexpected:
            raise KeyError(f"load_weights: unexpected tensors {unexpected[:8]}")
        if self.recapture_after_load and self.graphs is not None:
            self.graphs.invalidate()   # emulated linears cache dequantized weights outside the buffers
        if self.operand_cache:         # refreshed in place above (refresh_layouts); never silently lost
            from trace_rl.engine.operand_cache import check_model
            check_model(self.model)
        self.policy_version = int(version)

    # -- the decode step over slots [0, n): what a CUDA graph captures --
    def _decode_forward(self, n: int, path: str | None, span: int | None = None) -> torch.Tensor:
        pos = self.positions[:n]
        if self.recorder is not None:    # where each slot's guidance record goes (computed on the device)
            self.recorder.decode_rows(n, self.ngen)
        table = self.block_table[:n]
        kv = KVStep(self.cache, slots_for(table, pos[:, None], self.block_size), table, (pos + 1).to(torch.int32),
                    prefill=False, capacity=self.capacity if self.kv_layout == "contiguous" else None,
                    attention=path, span=span)
        return self.model(self.tokens[:n, None], pos[:, None], kv)[:, 0]

    def _step(self, n: int, path: str | None, sampling: tuple[float, int, float], span: int | None = None) -> None:
        """Forward, sample, record the token and its log-prob at the slot's ngen, stop check, advance."""
        logits = self._decode_forward(n, path, span)
        with op_range("sampling"):
            tok, logp = sample_with_counter(logits, *sampling, self.rng)
        with op_range("bookkeeping"):
            self._bookkeeping(n, tok, logp)

    def _bookkeeping(self, n: int, tok: torch.Tensor, logp: torch.Tensor) -> None:
        live, rows = self.live[:n], self._rows[:n]
        col = self.ngen[:n].clamp(max=self.max_seq_len - 1)
        self.hist_tokens[rows, col] = torch.where(live, tok, self.hist_tokens[rows, col])
        self.hist_logp[rows, col] = torch.where(live, logp, self.hist_logp[rows, col])
        ngen = self.ngen[:n] + live.long()
        stop = (ngen >= self.limit[:n]) | (tok[:, None] == self.stop_ids[None, :]).any(1)
        advance = live & ~stop
        self.tokens[:n] = torch.where(advance, tok, self.tokens[:n])
        self.positions[:n] += advance.long()
        self.live[:n] = advance
        self.ngen[:n] = ngen
        self.rng[1] += 1

    @contextlib.contextmanager
    def _quiet(self):
        """Warm-up steps before a capture change nothing: no slot is live, and the RNG step is restored."""
        saved = [t.clone() for t in (self.live, self.rng)]
        self.live.zero_()
        try:
            yield
        finally:
            self.live.copy_(saved[0])
            self.rng.copy_(saved[1])

    def decode_step(self, n: int, max_len: int, sampling: tuple[float, int, float]) -> None:
        """One decode step over slots [0, n) (graph replay on GPU); `max_len`: the longest context any of
        them reaches in this step (chooses the attention path)."""
        b = bucket_for(self.buckets, n)
        path = self.attention_path(b, max_len)
        span = self.attention_span(path, max_len)
        if self.graphs is None:              # eager: exactly the n rows (noise is per row: the same draws)
            self._step(n, path, sampling, span)
        else:
            self.graphs.run(("step", b, path, span, sampling), lambda: self._step(b, path, sampling, span),
                            self._quiet)
        self.stats["decode_steps"] += 1
        self.stats["decode_rows"] += b if self.graphs is not None else n

    def decode_logits(self, n: int, max_len: int | None = None, path: str | None = None) -> torch.Tensor:
        """Logits [n, V] of the decode forward alone over slots [0, n) (a graph of its own on GPU; the
        benches time it against the plain PyTorch step). Writes the current tokens' K/V, changes no state.
        `path`: a decode-attention path (default: the engine's choice for this batch and context)."""
        b = bucket_for(self.buckets, n)
        max_len = max_len or self.capacity
        path = path or self.attention_path(b, max_len)
        span = self.attention_span(path, max_len)
        if self.graphs is None:
            return self._decode_forward(b, path, span)[:n]
        return self.graphs.run(("forward", b, path, span), lambda: self._decode_forward(b, path, span),
                               contextlib.nullcontext)[:n]

    # -- attention path per (batch bucket, context bucket) --
    def attention_path(self, n: int, max_len: int) -> str:
        key = (n, self.context_bucket(max_len))
        if key in self.attention_choice:
            return self.attention_choice[key]["path"]
        candidates = self.attention_candidates(n, max_len)
        if len(candidates) == 1:
            return candidates[0]
        self.attention_choice[key] = self._time_attention(n, key[1], candidates)
        log.info("decode attention for batch %d, context <= %d: %s (%s; ms per layer call, %s)", n, key[1],
                 self.attention_choice[key]["path"], self.attention_choice[key]["ms"],
                 self.attention_choice[key]["timed"])
        return self.attention_choice[key]["path"]

    def attention_candidates(self, n: int, max_len: int) -> list[str]:
        """The decode-attention paths `attention_path` chooses among at n rows and contexts <= max_len."""
        return self.cache.candidates(self.kv_layout == "contiguous", n, self.context_bucket(max_len), self.capacity)

    def attention_span(self, path: str, max_len: int) -> int | None:
        """The span `path` reads (or divides) at contexts <= max_len: the context bucket where the path reads one
        (`kv.cache.reads_span`), else None (one graph per path, whatever the context)."""
        return self.context_bucket(max_len) if reads_span(path) else None

    def context_bucket(self, length: int) -> int:
        """Contexts share an attention choice (and the span a span path reads) per CONTEXT_STEP tokens."""
        return min(self.capacity, -(-max(length, 1) // CONTEXT_STEP) * CONTEXT_STEP)

    @torch.no_grad()
    def _time_attention(self, n: int, length: int, candidates: list[str], timer=None) -> dict:
        """Each path's time per layer call at n rows of `length` tokens (a random query; reads only), the fastest
        chosen. As the step runs: with CUDA graphs, one graph of calls over the first ATTENTION_TIME_LAYERS
        layers' caches (no launch gaps; replays read memory, not layer 0's L2-hot pages), its median replay per
        call; eager, layer 0's calls each timed alone. `timer(calls) -> ms per call` replaces this (tests)."""
        from trace_rl.engine.timing import graph_median_us, median_ms

        c = self.model.config
        graphed = self.graphs is not None
        layers = range(min(c.num_layers, ATTENTION_TIME_LAYERS) if graphed else 1)
        if timer is None and graphed:
            timer = lambda calls: graph_median_us(calls, reps=7, warmup=2) / 1e3  # noqa: E731
            how = f"cuda graph of {len(layers)} layer calls, median of 7 replays"
        elif timer is None:
            timer = lambda calls: median_ms(calls[0], self.device, iters=5, warmup=2)  # noqa: E731
            how = "eager layer 0 calls, median of 5"
        else:
            how = "injected"
        q = torch.randn(n, c.num_heads, c.head_dim, device=self.device, dtype=self.dtype)
        lens = torch.full((n,), length, dtype=torch.int32, device=self.device)
        table = torch.arange(n * self.pages_per_seq, device=self.device, dtype=torch.int32).view(n, -1) \
            if self.kv_layout == "contiguous" else self.block_table[:n]
        times = {}
        for path in candidates:
            span = length if reads_span(path) else None
            calls = [lambda i=i, p=path, s=span: self.cache.decode(i, q, table, lens, c.head_dim ** -0.5,
                                                                   self.capacity, p, s) for i in layers]
            try:
                times[path] = round(timer(calls), 5)
            except Exception as err:   # a path that cannot run (or be captured) at this shape: say so, skip
                log.warning("decode attention %s failed at batch %d, context %d (%s): %s", path, n, length, how,
                            err)
                times[path] = None
        ok = {p: t for p, t in times.items() if t is not None}
        if not ok:
            raise RuntimeError(f"no decode-attention path runs at batch {n}, context {length}: {times}")
        return {"path": min(ok, key=ok.get), "ms": times, "timed": how}

    # -- generation --
    @torch.no_grad()
    def generate(self, prompts: TensorDict, sampling: SamplingParams) -> TensorDict:
        from trace_rl.engine.scheduler import Scheduler

        prompt_tokens = prompts.get(K.TOKENS_PROMPT).to(self.device)
        prompt_mask = prompts.get(K.MASK_PROMPT).to(self.device).bool()
        lens = prompt_mask.sum(1)
        lens_host = lens.tolist()
        if min(lens_host) < 1 or not bool((prompt_mask == (torch.arange(prompt_mask.shape[1], device=self.device)
                                                           < lens[:, None])).all()):
            raise ValueError("prompts must be right-padded with at least one token each "
                             "(masks: True for the first len tokens, then False)")
        if max(lens_host) + sampling.max_new_tokens > self.max_seq_len:
            raise ValueError(f"prompt ({max(lens_host)} tokens) + max_new_tokens ({sampling.max_new_tokens}) exceeds "
                             f"the engine's max_seq_len={self.max_seq_len}; build the engine with a larger max_seq_len")
        stops = () if sampling.ignore_stop else tuple(sampling.stop_token_ids)
        if len(stops) > MAX_STOP_IDS:
            raise ValueError(f"at most {MAX_STOP_IDS} stop_token_ids, got {len(stops)}")
        run = Scheduler(self, sampling, prompt_tokens, lens, lens_host, stops)
        run.loop()
        return run.result(prompt_tokens, prompt_mask)
