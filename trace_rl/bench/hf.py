"""The rollout bench's `hf` part: transformers' `generate` against the native engine on the same workload.

HF `generate` (dynamic cache, SDPA) is slow enough on a long workload that a device call can run out before it
ends, and its per-token cost grows with the context, so neither "HF's whole run" nor "HF's first N tokens against
our whole run" is a fair ratio. What is compared (both sides bf16, same prompts, batch, sampling settings; stops
ignored):

- **HF decode rate** (`hf_decode_tokens_per_s`): `DecodeClock`, a stopping criterion, is called by `generate`
  after each token is appended. Its clock is synchronised with the GPU when token 1 (sampled from the prefill's
  logits) is appended and when HF's last token n is: rate = batch * (n - 1) / (t_n - t_1). Prefill, model build
  and warm-up are outside. With `--hf-time-limit S` the criterion stops `generate` once S seconds have passed since
  the call began (never before token 2): the row says `hf_truncated`, the tokens reached and the seconds.
- **Native decode rate over the same tokens** (`native_decode_tokens_per_s_same_tokens`): the engine, warmed up on
  the whole workload (graphs captured, attention tuned, as a long-lived RL engine), runs the same prompts for n
  and for 1 new tokens: rate = batch * (n - 1) / (wall(n) - wall(1)), i.e. the same n - 1 decode steps per row at
  the same contexts P+1 .. P+n-1. wall(1) is the median of 3 runs.
- The claim: `native_vs_hf_decode_same_tokens` = native rate / HF rate over those same tokens. Also reported:
  the native decode rate over the whole `--hf-new-tokens` (`native_decode_tokens_per_s_full`), the whole-call
  tokens/s of each side (prefill included), and, when HF finished, the whole-run ratio (`speedup`).
"""

from __future__ import annotations

import statistics
import time

import torch

from trace_rl.bench import measure as bm

RATE_DEFINITIONS = {
    "hf_decode_tokens_per_s": "batch * (n - 1) / (t_n - t_1): t_k = GPU-synchronised time when HF's generate "
                              "appended token k (stopping-criterion call k); n = HF's last token; excludes prefill",
    "native_decode_tokens_per_s_same_tokens": "batch * (n - 1) / (wall(generate n new) - wall(generate 1 new)), "
                                              "same prompts and n as HF, engine warmed up; excludes prefill",
    "native_decode_tokens_per_s_full": "the same with n = --hf-new-tokens",
    "native_vs_hf_decode_same_tokens": "native_decode_tokens_per_s_same_tokens / hf_decode_tokens_per_s (the claim)",
    "speedup": "HF whole generate wall / native whole generate wall, only when HF was not truncated",
}


class DecodeClock:
    """A `generate` stopping criterion (HF calls it once per appended token with the ids so far) that times the
    decode, logs progress every `every` tokens and, when `limit_s` > 0, stops every row once `limit_s` seconds
    have passed since it was made (made right before the call), never before token 2 so a rate exists.
    The clock is synchronised with the GPU only at token 1, at every `every`-th token and at the last token (HF
    itself synchronises each step on CUDA; this adds nothing in between). `now` is injectable for tests."""

    def __init__(self, prompt_width: int, new_tokens: int, limit_s: float, device, log, every: int,
                 now=time.perf_counter):
        self.prompt_width, self.new_tokens, self.limit_s = prompt_width, new_tokens, limit_s
        self.device, self.log, self.every, self.now = torch.device(device), log, max(1, every), now
        self.start = now()
        self.first: float | None = None                 # synchronised time of token 1
        self.last: tuple[int, float, bool] | None = None  # (token, time, synchronised)
        self.points: list[tuple[int, float]] = []
        self.stopped_at: int | None = None
        self._flags: dict = {}

    def _synced(self) -> float:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return self.now() - self.start

    def __call__(self, input_ids: torch.Tensor, scores=None, **kwargs) -> torch.Tensor:
        n = input_ids.shape[1] - self.prompt_width
        due = self.limit_s > 0 and n >= 2 and self.now() - self.start >= self.limit_s
        if n == 1 or due or n >= self.new_tokens or n % self.every == 0:
            t = self._synced()
            self.last = (n, t, True)
            if n == 1:
                self.first = t
                self.log(f"HF generate: token 1 (the prefill's) at {t:.1f} s")
            else:
                self.points.append((n, t))
                rate = decode_rate(input_ids.shape[0], n, self.first, t)
                self.log(f"HF generate: token {n} at {t:.1f} s" + (f" ({rate:.0f} decode tok/s since token 1)"
                                                                   if rate else "") + (" - time limit" if due else ""))
        else:
            self.last = (n, self.now() - self.start, False)
        if due:
            self.stopped_at = n
        key = (input_ids.shape[0], input_ids.device, due)
        if key not in self._flags:
            self._flags[key] = torch.full((input_ids.shape[0],), due, dtype=torch.bool, device=input_ids.device)
        return self._flags[key]

    def result(self, batch: int) -> dict:
        """The HF side's fields of the row (tokens reached, seconds, decode rate, truncated)."""
        n, t, synced = self.last if self.last else (0, 0.0, False)
        return {"hf_tokens_reached": n, "hf_truncated": self.stopped_at is not None and n < self.new_tokens,
                "hf_time_limit_s": self.limit_s or None, "hf_token1_s": self.first, "hf_last_token_s": t,
                "hf_last_token_synced": synced,
                "hf_decode_s": t - self.first if self.first is not None and n >= 2 else None,
                "hf_decode_tokens_per_s": decode_rate(batch, n, self.first, t), "hf_progress": self.points}


def decode_rate(batch: int, n: int, t1: float | None, tn: float) -> float | None:
    """Tokens of decode steps 2..n of `batch` rows per second between token 1 (at t1) and token n (at tn)."""
    if t1 is None or n < 2 or tn <= t1:
        return None
    return batch * (n - 1) / (tn - t1)


def ratio(native: float | None, hf: float | None) -> float | None:
    return native / hf if native and hf else None


def hf_vs_native(args, name: str, device, log) -> dict:
    """HF `generate` and our engine (bf16) on the same workload: `--hf-batch` prompts of `--prompt-len`
    tokens, `--hf-new-tokens` sampled tokens each (stops ignored), on `--hf-model` (default: the bench's
    model) cut to `--hf-layers` layers (0: all), random weights; HF stopped after `--hf-time-limit` s (0: never).
    Each side is warmed up first (HF: a 2-token generate; ours: the same workload once, which captures its
    graphs and tunes its attention, as a long-lived RL engine would have). Rates: the module's docstring."""
    from dataclasses import replace

    from transformers import AutoConfig, AutoModelForCausalLM, StoppingCriteria, StoppingCriteriaList

    from trace_rl.bench.measure import build_rollout_model, free
    from trace_rl.bench.workloads import random_prompts
    from trace_rl.data import schema as K
    from trace_rl.engine.base import SamplingParams
    from trace_rl.engine.hf import HFEngine
    from trace_rl.engine.native import NativeEngine
    from trace_rl.models import preset
    from trace_rl.plan import PrecisionPlan

    free()
    model_name = args.hf_model or name
    config = preset(model_name)
    if args.hf_layers:
        config = replace(config, num_layers=args.hf_layers)
    batch, new, p = args.hf_batch, args.hf_new_tokens, args.prompt_len
    limit = float(getattr(args, "hf_time_limit", 0.0) or 0.0)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    prompts = random_prompts(batch, p, config.vocab_size, device, args.seed)
    sampling = SamplingParams(temperature=1.0, max_new_tokens=new, ignore_stop=True, seed=args.seed)
    tokens = lambda k: sampling.model_copy(update={"max_new_tokens": k})  # noqa: E731
    # ours first: a failure of the HF side then still leaves the native numbers in the log
    model = build_rollout_model(model_name, PrecisionPlan(), device, dtype, args.seed, args.hf_layers)
    ours = NativeEngine(model, PrecisionPlan(), max_batch=batch, max_seq_len=p + new, device=device,
                        graph_buckets=[batch])
    wall = lambda k: bm.wall_s(lambda: ours.generate(prompts, tokens(k)), device)  # noqa: E731
    warm_s = wall(new)
    ours_s = wall(new)
    one_s = statistics.median(wall(1) for _ in range(3))
    capture_s = ours.report()["graph_capture_s"]
    native_full = decode_rate(batch, new, one_s, ours_s)
    log(f"HF-vs-native {model_name}[{config.num_layers} layers] B={batch} new={new}: native "
        f"{batch * new / ours_s:.0f} tok/s whole call ({ours_s:.2f} s; first run {warm_s:.2f} s with captures), "
        f"decode {native_full or 0:.0f} tok/s (1 new token: {one_s:.3f} s)")
    cfg = AutoConfig.for_model(**config.to_hf_dict("bfloat16"))
    with torch.device(device):
        hf = AutoModelForCausalLM.from_config(cfg, dtype=dtype).eval()
    engine = HFEngine(hf, return_log_probs=False)
    engine.generate(prompts, tokens(2))

    class _Criterion(StoppingCriteria):       # HF's list wants its own type; the clock does the work
        def __init__(self, clock):
            self.clock = clock

        def __call__(self, input_ids, scores, **kwargs):
            return self.clock(input_ids, scores, **kwargs)

    clock = DecodeClock(prompts[K.TOKENS_PROMPT].shape[1], new, limit, device, log, every=max(1, new // 8))
    engine.stopping_criteria = StoppingCriteriaList([_Criterion(clock)])
    holder: dict = {}
    hf_s = bm.wall_s(lambda: holder.update(out=engine.generate(prompts, sampling)), device)
    engine.stopping_criteria = None
    side = clock.result(batch)
    hf_generated = int(holder["out"][K.NUM_GENERATED].max())
    hf_attention = getattr(hf.config, "_attn_implementation", None)
    holder.clear()
    engine = hf = None            # HF's weights and cache go before the native engine's run over HF's tokens
    free()
    n = side["hf_tokens_reached"]
    if n == new:
        same_s = ours_s
    else:          # the same decode steps as HF's (contexts P+1 .. P+n-1), on the warmed-up engine; a median of 3
        # like `one_s`: one run against a median let noise put it under `one_s` (no rate) when n is a few tokens
        same_s = statistics.median(wall(n) for _ in range(3)) if n >= 2 else None
    native_same = decode_rate(batch, n, one_s, same_s) if same_s else None
    free(ours, model)
    res = {"model": model_name, "layers": config.num_layers, "batch": batch, "prompt_len": p, "new_tokens": new,
           "hf_s": hf_s, "hf_generated_tokens": hf_generated, **side,
           "native_s": ours_s, "native_first_run_s": warm_s, "native_graph_capture_s": capture_s,
           "native_one_token_s": one_s, "native_same_tokens_s": same_s,
           "native_decode_tokens_per_s_full": native_full, "native_decode_tokens_per_s_same_tokens": native_same,
           "native_vs_hf_decode_same_tokens": ratio(native_same, side["hf_decode_tokens_per_s"]),
           "native_full_vs_hf_decode": ratio(native_full, side["hf_decode_tokens_per_s"]),
           "hf_tokens_per_s": batch * hf_generated / hf_s, "native_tokens_per_s": batch * new / ours_s,
           # whole-run ratios only mean something when HF ran the whole workload
           "speedup": None if side["hf_truncated"] else hf_s / ours_s,
           "speedup_vs_native_first_run": None if side["hf_truncated"] else hf_s / warm_s,
           "hf_attention": hf_attention, "rate_definitions": RATE_DEFINITIONS}
    cut = f"TRUNCATED at token {n}/{new} after {hf_s:.1f} s" if side["hf_truncated"] else f"{n}/{new} tokens"
    log(f"HF {model_name} B={batch} new={new}: HF {cut}, decode {side['hf_decode_tokens_per_s'] or 0:.0f} tok/s "
        f"over tokens 2..{n}; native over the same tokens {native_same or 0:.0f} tok/s -> "
        f"{res['native_vs_hf_decode_same_tokens'] or 0:.1f}x (native over all {new}: {native_full or 0:.0f} tok/s)")
    return res
