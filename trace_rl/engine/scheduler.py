"""`Scheduler`: one `NativeEngine.generate` call. Admits samples into slots, prefills them, runs decode steps,
grows their pages, preempts when pages run out, and harvests finished samples; all host decisions happen
at sync points (the device runs `steps` decode steps between two of them).

Pages (`kv_layout="pool"`): a sample holds `Seq.pages` (its block-table row). Before each run of `steps`
steps every running sample gets the pages its next `steps` tokens need; if the pool is short, the newest
sample is preempted (pages released, its tokens and log-probs kept) and goes back to the front of the
queue; re-admitted, its prompt and generated tokens are prefilled again (recompute) and it continues.
Prefix sharing (`share_prefix`): the samples of one prompt admitted together are prefilled once; each
holds the prompt's full pages (one reference each) and gets its own copy of the partial last page, the
first page it writes (copy-on-write). The prompt's pages and last-position logits stay in a registry while
a sample holds them, so a sibling admitted later shares them too. `contiguous` layout: slot s owns pages
s*P.., prompt pages are copied to siblings' slots, nothing is preempted.

Compaction: when samples end, the highest slots move into free lower slots (block-table row and state
copied; in the contiguous layout their used pages too) whenever that lets a smaller batch bucket run.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import torch
from tensordict import TensorDict

from trace_rl.data import schema as K
from trace_rl.engine.base import rollout_output
from trace_rl.engine.cuda_graphs import bucket_for
from trace_rl.engine.sampling import sample_with_counter

POOL_LOOKAHEAD = 64        # most steps between syncs when no stop token can end a sample early (pool layout)


@dataclass
class Seq:
    row: int
    prompt: int
    slot: int
    order: int                                  # admission order (the newest is preempted first)
    pages: list[int] = field(default_factory=list)


@dataclass
class Shared:
    """A prompt's prefill, shared by its samples while one of them holds it."""
    full: list[int]                             # full prompt pages (pool: reference-counted)
    logits: torch.Tensor                        # [V] logits at the prompt's last position
    holders: set[int] = field(default_factory=set)          # slots of the samples holding this prefill
    partial: dict[int, int] = field(default_factory=dict)   # pool: slot -> that sample's partial prompt page


class Scheduler:
    def __init__(self, engine, sampling, prompt_tokens, lens, lens_host, stops: tuple[int, ...]):
        e, dev = engine, engine.device
        self.e, self.sampling, self.n = e, sampling, sampling.n
        self.rows = len(lens_host) * sampling.n
        self.prompt_tokens, self.lens, self.lens_host = prompt_tokens, lens, lens_host
        self.max_new, self.stops = sampling.max_new_tokens, stops
        self.skey = (float(sampling.temperature), int(sampling.top_k), float(sampling.top_p))
        self.pool = e.pool if e.kv_layout == "pool" else None
        self.trash = self.rows                        # output row of idle slots
        self.out_tokens = torch.full((self.rows + 1, self.max_new), e.pad_token_id, dtype=torch.long, device=dev)
        self.out_logp = torch.zeros(self.rows + 1, self.max_new, dtype=torch.float32, device=dev)
        self.out_ngen = torch.zeros(self.rows + 1, dtype=torch.long, device=dev)
        self.ngen = [0] * self.rows                    # host: tokens generated per row (known at syncs)
        self.pending = deque(range(self.rows))
        self.seqs: dict[int, Seq] = {}                 # slot -> running sample
        self.registry: dict[int, Shared] = {}          # prompt -> its shared prefill
        self.order = 0
        seed = sampling.seed if sampling.seed is not None else int(torch.randint(0, 2**62, ()).item())
        e.rng.copy_(torch.tensor([seed, 0], dtype=torch.long))
        e.stop_ids.fill_(-1)
        if stops:
            e.stop_ids[: len(stops)] = torch.tensor(stops, dtype=torch.long, device=dev)
        e.live.zero_()
        e.ngen.zero_()
        e.positions.zero_()
        e.tokens.fill_(e.pad_token_id)
        e.slot_row.fill_(self.trash)
        e.limit.fill_(self.max_new)
        if self.pool is not None:
            e.block_table.fill_(e.trash_page)
        if e.recorder is not None:
            e.recorder.begin(self.rows, prompt_tokens.shape[1], self.max_new)
        if e.routing is not None:
            e.routing.begin(len(lens_host), prompt_tokens.shape[1], self.rows, self.max_new)

    # -- the loop --
    def loop(self) -> None:
        e = self.e
        while self.pending or self.seqs:
            self._admit()
            if not self.seqs:
                raise RuntimeError("the scheduler could not admit any sample: the KV pool is smaller than one "
                                   "prompt plus its first pages")
            steps = min(self.max_new - self.ngen[s.row] for s in self.seqs.values())
            steps = min(steps, e.stop_check_interval if self.stops else
                        (POOL_LOOKAHEAD if self.pool is not None else steps))
            if e.recorder is not None:       # the GPU holds `window` positions of records per slot
                steps = min(steps, e.recorder.window)
            if steps > 0 and self.pool is not None:
                self._reserve(steps)
            self._compact()
            if steps > 0:
                n = max(self.seqs) + 1
                max_len = max(self._cached(s) for s in self.seqs.values()) + steps
                for _ in range(steps):
                    # MoE routing: the fed token of slot i is response token ngen - 1 of its row
                    where = None if e.routing is None else (
                        torch.where(e.live[:n], e.slot_row[:n], self.trash), (e.ngen[:n] - 1).clamp(min=0))
                    e.decode_step(n, max_len, self.skey)
                    if where is not None:
                        e.routing.store_decode(*where)
                if e.recorder is not None:       # before harvest and compaction move or free slots
                    e.recorder.flush([(slot, s.row, self.lens_host[s.prompt]) for slot, s in self.seqs.items()],
                                     steps, self.max_new)
            self._harvest()
        if self.pool is not None:
            e.stats["peak_pages"] = max(e.stats["peak_pages"], self.pool.peak_used)

    def _cached(self, s: Seq) -> int:
        """Tokens of the sample in the cache: the prompt and all generated tokens but the last (fed next)."""
        return self.lens_host[s.prompt] + self.ngen[s.row] - 1

    # -- pages --
    def _pages_for(self, tokens: int) -> int:
        return -(-tokens // self.e.block_size)

    def _set_table(self, seqs: list[Seq]) -> None:
        if not seqs or self.pool is None:
            return
        e = self.e
        table = torch.full((len(seqs), e.pages_per_seq), e.trash_page, dtype=torch.int32)
        for i, s in enumerate(seqs):
            table[i, : len(s.pages)] = torch.tensor(s.pages, dtype=torch.int32)
        e.block_table[torch.tensor([s.slot for s in seqs], device=e.device)] = table.to(e.device)

    def _reserve(self, steps: int) -> None:
        """Give every running sample the pages of its next `steps` tokens; preempt the newest while short."""
        while True:
            want = {}
            for s in self.seqs.values():
                tokens = min(self._cached(s) + steps, self.lens_host[s.prompt] + self.max_new - 1)
                want[s.slot] = max(0, self._pages_for(tokens) - len(s.pages))
            if sum(want.values()) <= self.pool.free or len(self.seqs) == 1:
                break
            self._preempt(max(self.seqs.values(), key=lambda s: s.order))
        grown = []
        for slot, k in want.items():
            if k:
                pages = self.pool.alloc(k)
                if pages is None:
                    raise RuntimeError("KV pool exhausted by a single sample (num_pages too small for max_seq_len)")
                self.seqs[slot].pages += pages
                grown.append(self.seqs[slot])
        self._set_table(grown)

    def _release(self, s: Seq) -> None:
        shared = self.registry.get(s.prompt)
        if shared is not None and s.slot in shared.holders:
            shared.holders.discard(s.slot)
            shared.partial.pop(s.slot, None)
            if not shared.holders:
                del self.registry[s.prompt]
        if self.pool is not None:
            self.pool.release(s.pages)
        s.pages = []

    def _preempt(self, s: Seq) -> None:
        e = self.e
        slot = torch.tensor([s.slot], device=e.device)
        self.out_tokens[s.row] = e.hist_tokens[slot, : self.max_new][0]
        self.out_logp[s.row] = e.hist_logp[slot, : self.max_new][0]
        self._release(s)
        self._reset_slots([s.slot])
        del self.seqs[s.slot]
        self.pending.appendleft(s.row)
        e.stats["preemptions"] += 1

    def _reset_slots(self, slots: list[int]) -> None:
        e = self.e
        idx = torch.tensor(slots, device=e.device)
        e.live[idx] = False
        e.positions[idx] = 0
        e.tokens[idx] = e.pad_token_id
        e.slot_row[idx] = self.trash
        if self.pool is not None:
            e.block_table[idx] = e.trash_page

    # -- admission and prefill --
    def _admit(self) -> None:
        e = self.e
        free = [s for s in range(e.max_batch) if s not in self.seqs]
        admitted: list[Seq] = []
        budget = self.pool.free if self.pool is not None else None
        # Keep 1% of the pool free for running samples to grow into (as vLLM does); what runs short later
        # is settled by preempting the newest samples.
        watermark = max(1, self.pool.num_pages // 100) if self.pool is not None else 0
        new_prompts: dict[int, int] = {}               # prompt -> leader slot among this admission
        while self.pending and free:
            row = self.pending[0]
            prompt = row // self.n
            resumed = self.ngen[row] > 0
            if budget is not None:
                tokens = self.lens_host[prompt] + max(self.ngen[row] - 1, 0)
                shareable = not resumed and self.share_prefix_for(prompt, new_prompts)
                need = (1 if tokens % e.block_size else 0) if shareable else self._pages_for(tokens)
                if need + watermark > budget and (self.seqs or admitted):
                    break
                if need > budget:
                    raise RuntimeError(f"the KV pool ({self.pool.num_pages} pages) cannot hold one prompt of "
                                       f"{tokens} tokens")
                budget -= need
            self.pending.popleft()
            s = Seq(row, prompt, free.pop(0), self.order)
            self.order += 1
            if not resumed and self.share_prefix_for(prompt, new_prompts):
                new_prompts.setdefault(prompt, s.slot)
            admitted.append(s)
        if admitted:
            self._prefill(admitted)

    def share_prefix_for(self, prompt: int, new_prompts: dict[int, int]) -> bool:
        """Whether a fresh sample of `prompt` can share a prefill (this admission's, or a live one)."""
        return self.e.share_prefix and (prompt in self.registry or prompt in new_prompts)

    def _prefill(self, admitted: list[Seq]) -> None:
        """Prefill what the admitted samples need (one item per shared prompt, per unshared sample, per
        resumed sample), give them pages, sample fresh samples' first tokens, set their slots."""
        e = self.e
        resumed = [s for s in admitted if self.ngen[s.row] > 0]
        fresh = [s for s in admitted if self.ngen[s.row] == 0]
        items, leaders = [], {}                    # items: (seq, tokens, logits needed)
        for s in admitted:
            self.seqs[s.slot] = s
            if self.ngen[s.row] > 0:                                   # resumed: recompute its cache
                items.append((s, self._resume_tokens(s), False))
            elif e.share_prefix and s.prompt in self.registry:
                continue                                               # shares a live prefill
            elif e.share_prefix and s.prompt in leaders:
                continue                                               # shares this admission's prefill
            else:
                leaders[s.prompt] = s
                items.append((s, self.prompt_tokens[s.prompt, : self.lens_host[s.prompt]], True))
        for s, toks, _ in items:                                       # the prefilled sample's own pages
            self._own_pages(s, toks.shape[0])
        self._set_table([s for s, _, _ in items])
        logits = self._run_prefill(items)
        for s, _, needs_logits in items:
            if needs_logits and e.share_prefix:
                self._register(s, logits[s.slot])
        sharers = [s for s in fresh if s.slot not in logits]
        for s in sharers:                                              # full pages + own partial copy
            self._share_pages(s)
        self._set_table(sharers)
        if fresh:
            rows_logits = torch.stack([logits[s.slot] if s.slot in logits else self.registry[s.prompt].logits
                                       for s in fresh])
            tok, logp = sample_with_counter(rows_logits, *self.skey, e.rng)
            e.rng[1] += 1
            self._start(fresh, tok, logp)
        if resumed:
            self._resume(resumed)

    def _own_pages(self, s: Seq, tokens: int) -> None:
        e = self.e
        if self.pool is None:
            s.pages = list(range(s.slot * e.pages_per_seq, (s.slot + 1) * e.pages_per_seq))
            return
        pages = self.pool.alloc(self._pages_for(tokens))
        if pages is None:
            raise RuntimeError("KV pool exhausted during admission (scheduler accounting error)")
        s.pages = pages

    def _register(self, s: Seq, logits: torch.Tensor) -> None:
        plen, page = self.lens_host[s.prompt], self.e.block_size
        shared = Shared(s.pages[: plen // page], logits, {s.slot})
        if plen % page and self.pool is not None:
            shared.partial[s.slot] = s.pages[plen // page]
        self.registry[s.prompt] = shared

    def _share_pages(self, s: Seq) -> None:
        """A sibling of a prefilled prompt: the prompt's full pages and a copy of its partial last page
        (pool), or a copy of all the prompt's pages into its own slot's (contiguous)."""
        e = self.e
        shared = self.registry[s.prompt]
        plen = self.lens_host[s.prompt]
        if self.pool is None:
            n_pages = self._pages_for(plen)
            src = min(shared.holders) * e.pages_per_seq
            s.pages = list(range(s.slot * e.pages_per_seq, (s.slot + 1) * e.pages_per_seq))
            e.cache.copy_pages(torch.arange(src, src + n_pages, device=e.device),
                               torch.arange(s.pages[0], s.pages[0] + n_pages, device=e.device))
        else:
            self.pool.retain(shared.full)
            s.pages = list(shared.full)
            e.stats["shared_prompt_pages"] += len(shared.full)
            if plen % e.block_size:
                page = self.pool.alloc(1)
                if page is None:
                    raise RuntimeError("KV pool exhausted during admission (scheduler accounting error)")
                src = shared.partial[min(shared.partial)]
                e.cache.copy_pages(torch.tensor([src], device=e.device), torch.tensor(page, device=e.device))
                s.pages += page
                shared.partial[s.slot] = page[0]
        shared.holders.add(s.slot)

    def _resume_tokens(self, s: Seq) -> torch.Tensor:
        plen, g = self.lens_host[s.prompt], self.ngen[s.row]
        return torch.cat([self.prompt_tokens[s.prompt, :plen], self.out_tokens[s.row, : g - 1]])

    def _run_prefill(self, items) -> dict[int, torch.Tensor]:
        """Prefill items in chunks of about `prefill_tokens`; returns slot -> last-position logits [V]."""
        e = self.e
        out, chunk, count = {}, [], 0
        for item in items:
            if chunk and count + item[1].shape[0] > e.prefill_tokens:
                out.update(self._prefill_chunk(chunk))
                chunk, count = [], 0
            chunk.append(item)
            count += item[1].shape[0]
        if chunk:
            out.update(self._prefill_chunk(chunk))
        return out

    def _prefill_chunk(self, chunk) -> dict[int, torch.Tensor]:
        from trace_rl.formats.paged_kv import slots_for
        from trace_rl.kv import KVStep

        e, dev = self.e, self.e.device
        width = max(t.shape[0] for _, t, _ in chunk)
        tokens = torch.full((len(chunk), width), e.pad_token_id, dtype=torch.long, device=dev)
        for i, (_, t, _) in enumerate(chunk):
            tokens[i, : t.shape[0]] = t
        lens = torch.tensor([t.shape[0] for _, t, _ in chunk], device=dev)
        table = e.block_table[torch.tensor([s.slot for s, _, _ in chunk], device=dev)]
        positions = torch.arange(width, device=dev).expand(len(chunk), width)
        kv = KVStep(e.cache, slots_for(table, positions, e.block_size), table, lens.to(torch.int32), prefill=True)
        if e.recorder is not None:
            e.recorder.prefill(len(chunk) * width)
        if e.routing is not None:   # prompts prefilled fresh; a resumed sample keeps the records it had
            fresh = [i for i, (_, _, f) in enumerate(chunk) if f]
            e.routing.context = ("prefill", torch.tensor([chunk[i][0].prompt for i in fresh], dtype=torch.long,
                                                         device=dev),
                                 torch.tensor(fresh, dtype=torch.long, device=dev))
        logits = e.model(tokens, positions, kv, logits_at=lens - 1)               # [items, V]
        if e.recorder is not None:   # a prompt's records go to the rows of all its samples
            e.recorder.prefill_done(width, [(i, r, t.shape[0]) for i, (s, t, fresh) in enumerate(chunk) if fresh
                                            for r in range(s.prompt * self.n, (s.prompt + 1) * self.n)])
        if e.routing is not None:
            e.routing.context = None
        e.stats["prefill_tokens"] += int(lens.sum())
        return {s.slot: logits[i] for i, (s, _, fresh) in enumerate(chunk) if fresh}

    def _start(self, fresh: list[Seq], tok: torch.Tensor, logp: torch.Tensor) -> None:
        e, dev = self.e, self.e.device
        slots = torch.tensor([s.slot for s in fresh], device=dev)
        done = torch.full_like(tok, self.max_new <= 1, dtype=torch.bool)
        if self.stops:
            done |= (tok[:, None] == e.stop_ids[None, :]).any(1)
        e.hist_tokens[slots, 0] = tok
        e.hist_logp[slots, 0] = logp
        e.tokens[slots] = tok
        e.positions[slots] = torch.tensor([self.lens_host[s.prompt] for s in fresh], device=dev)
        e.ngen[slots] = 1
        e.live[slots] = ~done
        e.slot_row[slots] = torch.tensor([s.row for s in fresh], device=dev)
        for s in fresh:
            self.ngen[s.row] = 1

    def _resume(self, resumed: list[Seq]) -> None:
        e, dev = self.e, self.e.device
        slots = torch.tensor([s.slot for s in resumed], device=dev)
        rows = torch.tensor([s.row for s in resumed], device=dev)
        g = torch.tensor([self.ngen[s.row] for s in resumed], device=dev)
        e.hist_tokens[slots, : self.max_new] = self.out_tokens[rows]
        e.hist_logp[slots, : self.max_new] = self.out_logp[rows]
        e.tokens[slots] = self.out_tokens[rows, g - 1]
        e.positions[slots] = torch.tensor([self._cached(s) for s in resumed], device=dev)
        e.ngen[slots] = g
        last = e.tokens[slots]
        e.live[slots] = ~((g >= self.max_new) | (last[:, None] == e.stop_ids[None, :]).any(1))
        e.slot_row[slots] = rows

    # -- syncs --
    def _harvest(self) -> None:
        e = self.e
        occupied = sorted(self.seqs)
        if not occupied:
            return
        idx = torch.tensor(occupied, device=e.device)
        live, ngen = torch.stack([e.live[idx].long(), e.ngen[idx]]).tolist()
        done = []
        for slot, alive, g in zip(occupied, live, ngen):
            self.ngen[self.seqs[slot].row] = g
            if not alive:
                done.append(self.seqs[slot])
        if not done:
            return
        slots = torch.tensor([s.slot for s in done], device=e.device)
        rows = torch.tensor([s.row for s in done], device=e.device)
        self.out_tokens[rows] = e.hist_tokens[slots, : self.max_new]
        self.out_logp[rows] = e.hist_logp[slots, : self.max_new]
        self.out_ngen[rows] = e.ngen[slots]
        for s in done:
            self._release(s)
            del self.seqs[s.slot]
        self._reset_slots([s.slot for s in done])

    def _compact(self) -> None:
        """Move samples from the highest slots into free lower ones when that lets a smaller bucket run."""
        e = self.e
        if not self.seqs:
            return
        count = len(self.seqs)
        if bucket_for(e.buckets, max(self.seqs) + 1) == bucket_for(e.buckets, count):
            return
        holes = [s for s in range(count) if s not in self.seqs]
        movers = sorted((s for s in self.seqs if s >= count), reverse=True)[: len(holes)]
        src = torch.tensor(movers, device=e.device)
        dst = torch.tensor(holes[: len(movers)], device=e.device)
        for buf in (e.tokens, e.positions, e.live, e.ngen, e.limit, e.slot_row, e.hist_tokens, e.hist_logp):
            buf[dst] = buf[src]
        if self.pool is not None:
            e.block_table[dst] = e.block_table[src]
        for a, b in zip(movers, holes):
            s = self.seqs.pop(a)
            shared = self.registry.get(s.prompt)
            if self.pool is None:                     # contiguous: the sample's used pages move with it
                used = self._pages_for(self._cached(s) + 1)
                e.cache.copy_pages(torch.arange(a * e.pages_per_seq, a * e.pages_per_seq + used, device=e.device),
                                   torch.arange(b * e.pages_per_seq, b * e.pages_per_seq + used, device=e.device))
                s.pages = list(range(b * e.pages_per_seq, (b + 1) * e.pages_per_seq))
            if shared is not None and a in shared.holders:
                shared.holders.discard(a)
                shared.holders.add(b)
                if a in shared.partial:
                    shared.partial[b] = shared.partial.pop(a)
            s.slot = b
            self.seqs[b] = s
        self._reset_slots(movers)

    # -- output --
    def result(self, prompt_tokens: torch.Tensor, prompt_mask: torch.Tensor) -> TensorDict:
        e, rows = self.e, self.rows
        if self.pool is not None and not self.seqs:
            e.pool.check_empty()
        ngen = self.out_ngen[:rows]
        width = max(int(ngen.max()), 1)
        mask = torch.arange(width, device=e.device)[None, :] < ngen[:, None]
        tokens = self.out_tokens[:rows, :width].masked_fill(~mask, e.pad_token_id)
        logp = self.out_logp[:rows, :width].masked_fill(~mask, 0.0)
        prompt_index = torch.arange(rows, device=e.device) // self.n
        e.stats["generated_tokens"] += int(ngen.sum())
        td = rollout_output(
            prompt_tokens=prompt_tokens, prompt_mask=prompt_mask, prompt_index=prompt_index,
            response_tokens=tokens, response_mask=mask, rollout_log_probs=logp, num_generated=ngen.clone(),
            policy_version=e.policy_version, device=e.device)
        if e.recorder is not None:   # the records stay in (pinned) host memory: the TensorDict spans devices
            td.clear_device_()
            td.set(K.GUIDANCE, e.recorder.result(prompt_index, self.lens, ngen, prompt_tokens.shape[1], width))
        if e.routing is not None:
            td.set(K.ROUTING, e.routing.result(prompt_index, self.lens, ngen, prompt_tokens.shape[1], width))
        return td
