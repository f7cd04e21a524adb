"""`NativeEngine`: our rollout engine. Prefill, then batched decode over slots with a paged, quantized KV cache.

- The engine owns a rollout copy of the model (same module tree, `Decoder.to_rollout`: packed
  QuantLinear weights in the plan's formats); `load_weights` re-quantizes into those buffers in place.
- Slots: `max_batch` sequences decode together. Slot s owns the contiguous pages s*P .. s*P+P-1 of the
  cache (P = ceil(max_seq_len / block_size)); the block table says so, so the kernels see a paged cache.
  Continuous batching: when a sequence finishes, its slot takes the next pending sample (prefilled
  alone or with the other admitted samples). The `n` samples of a prompt share one prefill: the
  prompt's pages are copied to its siblings' slots.
- Decode step = model forward on slots [0, n) for the smallest batch bucket n covering the occupied
  slots, captured in a CUDA graph per bucket on GPU; sampling and bookkeeping run after it on the device.
  The host syncs only when a slot can have finished: after exactly the steps until the earliest forced
  end (no stop tokens), or every `stop_check_interval` steps when stop tokens are live.
- Sampling: `trace_rl.engine.sampling` (temperature, top-k, top-p). ("log_probs","rollout") is the
  log-probability of each sampled token under the distribution it was sampled from (after temperature,
  top-k and top-p renormalisation; 0 for greedy). A `seed` reproduces the samples for the same engine
  configuration (max_batch and buckets decide which rows share a noise draw).
"""

from __future__ import annotations

import logging
import math
from collections import OrderedDict, deque
from collections.abc import Mapping

import torch
from tensordict import TensorDict

from trace_rl.data import schema as K
from trace_rl.engine.base import RolloutEngine, SamplingParams
from trace_rl.engine.cuda_graphs import DecodeGraphs, batch_buckets
from trace_rl.engine.guidance import GuidanceRecorder
from trace_rl.engine.sampling import make_generator, process_logits, sample
from trace_rl.formats.paged_kv import slots_for
from trace_rl.kv import KVStep, PagedKVCache
from trace_rl.models.decoder import Decoder, build
from trace_rl.models.loading import load_state_dict_into
from trace_rl.plan import PrecisionPlan

log = logging.getLogger("trace_rl.engine")


def rollout_copy(model: Decoder, plan: PrecisionPlan, device: torch.device, dtype: torch.dtype) -> Decoder:
    """The rollout form of `model` under `plan` (a new module tree; `model` is left untouched)."""
    copy = build(model.config, device=device, dtype=dtype)
    load_state_dict_into(copy, model.state_dict())
    return copy.apply_plan(plan).to_rollout()


class NativeEngine(RolloutEngine):
    def __init__(self, model: Decoder, plan: PrecisionPlan | None = None, *, max_batch: int = 64,
                 max_seq_len: int = 2048, block_size: int = 16, device: torch.device | str | None = None,
                 dtype: torch.dtype | None = None, pad_token_id: int = K.PAD_TOKEN_ID_DEFAULT,
                 cuda_graphs: bool | None = None, attention: str = "auto", prefill_tokens: int = 16384,
                 stop_check_interval: int = 8, policy_version: int = 0, graph_buckets: list[int] | None = None,
                 record_guidance: bool | None = None):
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
        self.dtype = self.model.model.embed_tokens.weight.dtype
        c = self.model.config
        self.max_batch, self.max_seq_len, self.block_size = max_batch, max_seq_len, block_size
        self.pages_per_slot = math.ceil(max_seq_len / block_size)
        self.capacity = self.pages_per_slot * block_size
        self.cache = PagedKVCache(self.plan.kv_cache, c.num_layers, max_batch * self.pages_per_slot, block_size,
                                  c.num_kv_heads, c.head_dim, self.device, self.dtype, attention)
        if stop_check_interval < 1:
            raise ValueError(f"stop_check_interval must be >= 1, got {stop_check_interval}")
        self.pad_token_id, self.prefill_tokens = pad_token_id, prefill_tokens
        self.stop_check_interval, self.policy_version = stop_check_interval, policy_version
        dev, s = self.device, max_batch
        self.block_table = (torch.arange(s * self.pages_per_slot, device=dev, dtype=torch.int32)
                            .view(s, self.pages_per_slot))
        # Per-slot decode state (static buffers: the CUDA graphs read them).
        self.tokens = torch.full((s,), pad_token_id, dtype=torch.long, device=dev)   # token fed next step
        self.positions = torch.zeros(s, dtype=torch.long, device=dev)                # its position
        self.live = torch.zeros(s, dtype=torch.bool, device=dev)
        self.ngen = torch.zeros(s, dtype=torch.long, device=dev)                     # tokens generated so far
        self.slot_row = torch.zeros(s, dtype=torch.long, device=dev)                 # output row of the slot
        # TRACE guidance (plan.trainer == "guided"): record the rollout's FP4 rounding for the trainer.
        record = self.plan.trainer == "guided" if record_guidance is None else record_guidance
        self.recorder = GuidanceRecorder(self.model, self.plan) if record else None
        if self.recorder is not None:
            self.recorder.attach()
            if cuda_graphs:
                raise ValueError("guidance recording runs the decode step eagerly; use cuda_graphs=None/False")
            cuda_graphs = False
        use_graphs = self.device.type == "cuda" if cuda_graphs is None else cuda_graphs
        if use_graphs and self.device.type != "cuda":
            raise ValueError("cuda_graphs=True needs a CUDA device")
        buckets = graph_buckets or batch_buckets(max_batch)
        if max(buckets) != max_batch:
            raise ValueError(f"graph_buckets {buckets} must include max_batch={max_batch}")
        self.graphs = DecodeGraphs(self._decode_forward, buckets) if use_graphs else None
        self.recapture_after_load = any("emulated" in lin.quant.backend.available(self.device).path
                                        for lin in self.model.linears().values())
        self.stats = {"prefill_tokens": 0, "decode_steps": 0, "decode_rows": 0, "generated_tokens": 0}

    # -- reporting --
    def report(self) -> dict:
        """Which implementation each part ran (linear paths per backend, KV write, attention, graphs)."""
        backends = {lin.quant.backend.name: lin.quant.backend for lin in self.model.linears().values()}
        return {"plan": self.plan.label, "linear": {n: b.paths.summary() for n, b in backends.items()},
                "kv": dict(self.cache.paths), "kv_note": self.cache.why, "cuda_graphs": self.graphs is not None,
                "buckets": self.graphs.buckets if self.graphs else None, "max_batch": self.max_batch,
                "kv_cache_bytes": self.cache.nbytes,
                "guidance_bytes_per_token": self.recorder.bytes_per_token if self.recorder else 0, **self.stats}

    @property
    def guidance_sites(self) -> dict[str, str]:
        """Trainer module name (Linear, or '<attention>.k'/'.v') -> its record's key under ("guidance", ...)."""
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

        for name, lin in self.model.linears().items():
            parts = lin.fused_from or (name,)          # a fused rollout layer stacks its parts' weights
            weight = torch.cat([take(f"{p}.weight") for p in parts])
            bias = torch.cat([take(f"{p}.bias") for p in parts]) if lin.quant.bias is not None else None
            lin.quant.load_weight(weight, bias)
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
        self.policy_version = int(version)

    # -- one decode forward over slots [0, n): what the CUDA graph captures --
    def _decode_forward(self, n: int) -> torch.Tensor:
        pos = self.positions[:n]
        kv = KVStep(self.cache, slots_for(self.block_table[:n], pos[:, None], self.block_size),
                    self.block_table[:n], (pos + 1).to(torch.int32), prefill=False, capacity=self.capacity)
        return self.model(self.tokens[:n, None], pos[:, None], kv)[:, 0]

    def decode_logits(self, n: int) -> torch.Tensor:
        """Logits [n, V] of one decode step over slots [0, n) (graph replay on GPU)."""
        if self.graphs is None:
            return self._decode_forward(n)
        if not self.graphs.captured:
            self.graphs.capture()
        b, out = self.graphs.run(n)
        return out[:n]

    # -- generation --
    def _generator(self, seed: int | None) -> torch.Generator:
        return make_generator(seed, self.device)

    @torch.no_grad()
    def generate(self, prompts: TensorDict, sampling: SamplingParams) -> TensorDict:
        prompt_tokens = prompts.get(K.TOKENS_PROMPT).to(self.device)
        prompt_mask = prompts.get(K.MASK_PROMPT).to(self.device).bool()
        lens = prompt_mask.sum(1)
        lens_host = lens.tolist()
        if min(lens_host) < 1 or not bool((prompt_mask == (torch.arange(prompt_mask.shape[1], device=self.device)
                                                           < lens[:, None])).all()):
            raise ValueError("prompts must be right-padded with at least one token each "
                             "(masks: True for the first len tokens, then False)")
        n, max_new = sampling.n, sampling.max_new_tokens
        if max(lens_host) + max_new > self.max_seq_len:
            raise ValueError(f"prompt ({max(lens_host)} tokens) + max_new_tokens ({max_new}) exceeds the engine's "
                             f"max_seq_len={self.max_seq_len}; build the engine with a larger max_seq_len")
        rows = len(lens_host) * n
        run = _Run(self, sampling, prompt_tokens, lens, lens_host, rows)
        run.loop()
        return run.result(prompt_tokens, prompt_mask)


class _Run:
    """The state of one `generate` call: outputs, pending samples, slot ownership, the sampling RNG."""

    def __init__(self, engine: NativeEngine, sampling: SamplingParams, prompt_tokens, lens, lens_host, rows):
        e, dev = engine, engine.device
        self.e, self.sampling, self.rows = e, sampling, rows
        self.prompt_tokens, self.lens, self.lens_host = prompt_tokens, lens, lens_host
        self.max_new = sampling.max_new_tokens
        self.trash = rows                          # output row written by idle slots
        if e.recorder is not None:
            e.recorder.begin(len(lens_host), prompt_tokens.shape[1], rows, sampling.max_new_tokens)
        self.out_tokens = torch.full((rows + 1, self.max_new), e.pad_token_id, dtype=torch.long, device=dev)
        self.out_logp = torch.zeros(rows + 1, self.max_new, dtype=torch.float32, device=dev)
        self.out_ngen = torch.zeros(rows + 1, dtype=torch.long, device=dev)
        stops = () if sampling.ignore_stop else sampling.stop_token_ids
        self.stop_ids = torch.tensor(stops, dtype=torch.long, device=dev) if stops else None
        self.gen = e._generator(sampling.seed)
        self.pending = deque(range(rows))
        self.owner = [-1] * e.max_batch            # host: output row of each slot, -1 = free
        self.remaining = [0] * e.max_batch         # host: most steps a slot can still run
        e.live.zero_()
        e.ngen.zero_()
        e.positions.zero_()
        e.tokens.fill_(e.pad_token_id)
        e.slot_row.fill_(self.trash)

    def _sample(self, logits: torch.Tensor):
        s = self.sampling
        return sample(process_logits(logits, s.temperature, s.top_k, s.top_p), self.gen)

    def loop(self) -> None:
        e = self.e
        while self.pending or any(o >= 0 for o in self.owner):
            free = [s for s, o in enumerate(self.owner) if o < 0]
            if self.pending and free:
                self._admit(free[: len(self.pending)])
            occupied = [s for s, o in enumerate(self.owner) if o >= 0]
            steps = min(self.remaining[s] for s in occupied)
            if self.stop_ids is not None:
                steps = min(steps, e.stop_check_interval)
            n = max(occupied) + 1
            for _ in range(steps):
                self._decode_step(n)
            for s in occupied:
                self.remaining[s] -= steps
            self._harvest(occupied)

    def _admit(self, slots: list[int]) -> None:
        e = self.e
        groups: OrderedDict[int, list[tuple[int, int]]] = OrderedDict()   # prompt -> [(row, slot)]
        for slot in slots:
            row = self.pending.popleft()
            groups.setdefault(row // self.sampling.n, []).append((row, slot))
            self.owner[slot] = row
            self.remaining[slot] = self.max_new - 1
        chunk, tokens = [], 0
        for prompt, members in groups.items():
            if chunk and tokens + self.lens_host[prompt] > e.prefill_tokens:
                self._prefill(chunk)
                chunk, tokens = [], 0
            chunk.append((prompt, members))
            tokens += self.lens_host[prompt]
        self._prefill(chunk)

    def _prefill(self, chunk) -> None:
        e, dev = self.e, self.e.device
        prompts = torch.tensor([p for p, _ in chunk], device=dev)
        leaders = torch.tensor([m[0][1] for _, m in chunk], device=dev)
        lens = self.lens[prompts]
        width = max(self.lens_host[p] for p, _ in chunk)
        tokens = self.prompt_tokens[prompts, :width]
        positions = torch.arange(width, device=dev).expand(len(chunk), width)
        table = e.block_table[leaders]
        kv = KVStep(e.cache, slots_for(table, positions, e.block_size), table, lens.to(torch.int32), prefill=True)
        if e.recorder is not None:
            e.recorder.context = ("prefill", prompts, None)
        logits = e.model(tokens, positions, kv, logits_at=lens - 1)               # [prompts, V]
        if e.recorder is not None:
            e.recorder.context = None
        e.stats["prefill_tokens"] += int(sum(self.lens_host[p] for p, _ in chunk))
        pages = math.ceil(width / e.block_size)
        src, dst, member_rows, member_slots, member_of = [], [], [], [], []
        for i, (_, members) in enumerate(chunk):
            for row, slot in members:
                member_rows.append(row)
                member_slots.append(slot)
                member_of.append(i)
                if slot != members[0][1]:
                    src.append(e.block_table[members[0][1], :pages])
                    dst.append(e.block_table[slot, :pages])
        if src:
            e.cache.copy_pages(torch.cat(src).long(), torch.cat(dst).long())
        rows = torch.tensor(member_rows, device=dev)
        slots = torch.tensor(member_slots, device=dev)
        tok, logp = self._sample(logits[torch.tensor(member_of, device=dev)])
        self.out_tokens[rows, 0] = tok
        self.out_logp[rows, 0] = logp
        done = torch.full_like(tok, self.max_new <= 1, dtype=torch.bool)
        if self.stop_ids is not None:
            done |= torch.isin(tok, self.stop_ids)
        e.tokens[slots] = tok
        e.positions[slots] = lens[torch.tensor(member_of, device=dev)]
        e.ngen[slots] = 1
        e.live[slots] = ~done
        e.slot_row[slots] = rows

    def _decode_step(self, n: int) -> None:
        e = self.e
        if e.recorder is not None:   # the fed token of each slot is response token ngen - 1
            e.recorder.context = ("decode", torch.where(e.live[:n], e.slot_row[:n], self.trash),
                                  (e.ngen[:n] - 1).clamp(min=0))
        logits = e.decode_logits(n)
        if e.recorder is not None:
            e.recorder.context = None
        tok, logp = self._sample(logits)
        live = e.live[:n]
        row = torch.where(live, e.slot_row[:n], self.trash)
        col = e.ngen[:n].clamp(max=self.max_new - 1)
        self.out_tokens[row, col] = tok
        self.out_logp[row, col] = logp
        ngen = e.ngen[:n] + live.long()
        stop = ngen >= self.max_new
        if self.stop_ids is not None:
            stop |= torch.isin(tok, self.stop_ids)
        advance = live & ~stop
        e.ngen[:n] = ngen
        e.tokens[:n] = torch.where(advance, tok, e.tokens[:n])
        e.positions[:n] += advance.long()
        e.live[:n] = advance
        e.stats["decode_steps"] += 1
        e.stats["decode_rows"] += n

    def _harvest(self, occupied: list[int]) -> None:
        e = self.e
        live = e.live.tolist()
        done = [s for s in occupied if not live[s]]
        if not done:
            return
        slots = torch.tensor(done, device=e.device)
        rows = torch.tensor([self.owner[s] for s in done], device=e.device)
        self.out_ngen[rows] = e.ngen[slots]
        e.slot_row[slots] = self.trash
        for s in done:
            self.owner[s] = -1

    def result(self, prompt_tokens: torch.Tensor, prompt_mask: torch.Tensor) -> TensorDict:
        e, rows = self.e, self.rows
        ngen = self.out_ngen[:rows]
        width = max(int(ngen.max()), 1)
        mask = torch.arange(width, device=e.device)[None, :] < ngen[:, None]
        tokens = self.out_tokens[:rows, :width].masked_fill(~mask, e.pad_token_id)
        logp = self.out_logp[:rows, :width].masked_fill(~mask, 0.0)
        prompt_index = torch.arange(rows, device=e.device) // self.sampling.n
        e.stats["generated_tokens"] += int(ngen.sum())
        td = TensorDict({
            K.TOKENS_PROMPT: prompt_tokens[prompt_index],
            K.MASK_PROMPT: prompt_mask[prompt_index],
            K.TOKENS_RESPONSE: tokens,
            K.MASK_RESPONSE: mask,
            K.LOGP_ROLLOUT: logp,
            K.POLICY_VERSION: torch.full((rows,), e.policy_version, dtype=torch.long, device=e.device),
            K.NUM_GENERATED: ngen.clone(),
            K.PROMPT_INDEX: prompt_index,
        }, batch_size=[rows], device=e.device)
        if e.recorder is not None:
            td.set(K.GUIDANCE, e.recorder.result(prompt_index, self.lens, ngen, prompt_tokens.shape[1], width))
        return td
