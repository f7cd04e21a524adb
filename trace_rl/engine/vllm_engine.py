"""`VLLMEngine`: vLLM behind the `RolloutEngine` interface, quantizing as trace_rl's plan says.

- Built from a local HF-format folder (`VLLMEngine.from_model` writes one from a trainer Decoder). vLLM
  never sees a tokenizer (`skip_tokenizer_init`): prompts go in as token ids, responses come out as
  token ids, so char-level and real tokenizers alike stay on trace_rl's side.
- Linear layers: the plan's weight/activation formats through the `trace_rl` vLLM quantization plugin
  (`trace_rl.vllm_plugin`, passed in `hf_overrides`): the same codes and scales as the native engine.
- KV cache: vLLM's own `kv_cache_dtype`. `bf16` -> "auto" (the model dtype); `fp8_e4m3` -> vLLM's
  "fp8_e4m3", which scales per tensor (k/v scale 1.0 unless the checkpoint is calibrated), not per
  token and head as trace_rl's format does. nvfp4/mxfp4 KV are refused (vLLM has no such cache on CPU,
  and its GPU "nvfp4" cache is not trace_rl's format).
- Log-probs: vLLM reports log-probs of the raw logits unless `logprobs_mode="processed_logprobs"`, which
  this engine always sets: ("log_probs","rollout") is then log q of the distribution actually sampled
  (temperature, top-k, top-p renormalised), as `trace_rl.engine.sampling` defines it. vLLM's top-k keeps
  ties with the k-th logit and its top-p works on ascending cumulative sums; both select our set except
  on exact ties. Greedy (temperature 0) reports 0, the point mass, where vLLM would report the
  log-softmax.
- Stops: the model's EOS never stops implicitly (`ignore_eos`); `SamplingParams.stop_token_ids` are
  passed as vLLM's `stop_token_ids`; the stop token is part of the response, as in the other engines.
- Weight sync (`load_weights`): the trainer's HF-named tensors go to every worker through
  `collective_rpc` and vLLM's in-place `reload_weights` (the plugin re-quantizes), without restarting the
  engine; the prefix cache is reset so no KV computed with old weights is reused.
"""

from __future__ import annotations

import json
import logging
import math
import os
import tempfile
from collections.abc import Mapping
from contextlib import contextmanager
from pathlib import Path

import torch
from tensordict import TensorDict

from trace_rl.data import schema as K
from trace_rl.engine.base import RolloutEngine, SamplingParams, rollout_output
from trace_rl.plan import PrecisionPlan

log = logging.getLogger("trace_rl.engine.vllm")

KV_CACHE_DTYPES = {"bf16": "auto", "fp8_e4m3": "fp8_e4m3"}


def check_plan(plan: PrecisionPlan) -> None:
    """Raise (saying why and what to use) for plans vLLM cannot run as trace_rl defines them."""
    if plan.trainer == "guided":
        raise ValueError("trainer='guided' needs the rollout's rounding records (TRACE guidance), which only "
                         "the native engine writes; use rollout.engine 'native', or trainer 'bf16'/'aligned'")
    if plan.kv_cache not in KV_CACHE_DTYPES:
        raise ValueError(f"kv_cache={plan.kv_cache!r}: vLLM has no KV cache in trace_rl's {plan.kv_cache} "
                         f"format; use kv_cache 'bf16' or 'fp8_e4m3' (vLLM's per-tensor FP8) with the vllm "
                         f"engine, or the native engine for FP4 KV")
    for name in ("lm_head", "model.embed_tokens"):
        if plan.weight_format(name) != "bf16":
            raise ValueError(f"the plan quantizes {name!r}; the vLLM plugin keeps embeddings and the LM head in "
                             f"the model dtype. Keep them in keep_high_precision or use the native engine")


def encode_tensor(t: torch.Tensor) -> tuple[str, list[int], bytes]:
    """(dtype name, shape, raw bytes): what vLLM's inter-process RPC carries without pickle (its own tensor
    encoding is decoded only for typed fields, so a tensor inside `collective_rpc` args would arrive as raw
    buffers that the worker hop cannot re-send)."""
    t = t.detach().contiguous().cpu()
    return str(t.dtype).removeprefix("torch."), list(t.shape), t.view(torch.uint8).numpy().tobytes()


def decode_tensor(dtype: str, shape: list[int], data: bytes) -> torch.Tensor:
    raw = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    return raw.view(getattr(torch, dtype)).reshape(shape)


class TraceWorkerExtension:
    """Mixed into vLLM's worker class (`worker_extension_cls`), so `collective_rpc` reaches it by name on every
    worker (a method name, unlike a function, needs no pickling between processes)."""

    def trace_rl_reload_weights(self, weights: list) -> None:
        """vLLM's in-place reload from in-memory tensors (checkpoint names); quantized layers re-quantize.
        `weights`: [(name, tensor)] in process, [(name, dtype, shape, bytes)] across processes."""
        pairs = [(w[0], w[1] if len(w) == 2 else decode_tensor(*w[1:])) for w in weights]
        self.reload_weights(weights_iterator=iter(pairs), is_checkpoint_format=True)
        # A tied LM head loads nothing itself (its weight is the embedding's), so the reload never re-runs its
        # post-load processing; on CPU that processing packs a private copy of the weight for the GEMM, which
        # would keep computing logits with the old embedding. Re-run it.
        model = self.model_runner.get_model()
        head, embed = getattr(model, "lm_head", None), getattr(getattr(model, "model", None), "embed_tokens", None)
        if head is not None and embed is not None and head.weight.data_ptr() == embed.weight.data_ptr():
            head.quant_method.process_weights_after_loading(head)

    def trace_rl_report(self) -> dict:
        """Which path each trace_rl backend took in this worker (e.g. {'fp4': {'fp4.emulated': 96}}), and
        vLLM's KV-cache dtype."""
        from trace_rl.backends.registry import backend_names, get_backend

        linear = {name: get_backend(name).paths.summary() for name in backend_names()}
        return {"linear": {k: v for k, v in linear.items() if v},
                "kv_cache_dtype": str(self.vllm_config.cache_config.cache_dtype)}


@contextmanager
def _env(name: str, value: str | None):
    """Set an environment variable while vLLM reads it (building the LLM), then restore it, so one engine's
    choice does not leak into the next."""
    old = os.environ.get(name)
    if value is not None:
        os.environ[name] = value
    try:
        yield
    finally:
        if value is not None:
            if old is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = old


def _kv_cache_bytes(cfg: dict, dtype: str, max_batch: int, max_seq_len: int, kv_cache: str) -> int:
    """KV-cache memory for max_batch sequences of max_seq_len tokens (CPU: vLLM would else reserve a
    fraction of the machine's RAM)."""
    heads = cfg.get("num_key_value_heads", cfg["num_attention_heads"])
    head_dim = cfg.get("head_dim", cfg["hidden_size"] // cfg["num_attention_heads"])
    elem = 1 if kv_cache == "fp8_e4m3" else (4 if dtype == "float32" else 2)
    per_token = 2 * cfg["num_hidden_layers"] * heads * head_dim * elem
    return max(16 << 20, math.ceil(per_token * max_batch * (max_seq_len + 64) * 1.25))


class VLLMEngine(RolloutEngine):
    """Args beyond the native engine's: `dtype` (default: the checkpoint's `torch_dtype`), `seed` (vLLM's
    global sampling seed), `kv_cache_memory_bytes` (default on CPU: enough for max_batch x max_seq_len;
    on GPU: vLLM's `gpu_memory_utilization`, lower it when the trainer shares the GPU),
    `enforce_eager` (default True on CPU, where compilation costs minutes), `multiprocessing` (vLLM's
    engine core and worker in separate processes, VLLM_ENABLE_V1_MULTIPROCESSING; None: vLLM's default, yes.
    False starts in seconds instead of ~40 s on CPU and hands weights over by reference, but vLLM's CPU
    worker then binds this process's OpenMP threads and disables `torch.set_num_threads` in it), and any
    other `vllm.LLM` keyword in `llm_kwargs`."""

    def __init__(self, model_dir: str | Path, plan: PrecisionPlan | None = None, *, max_batch: int = 64,
                 max_seq_len: int = 2048, pad_token_id: int = K.PAD_TOKEN_ID_DEFAULT, policy_version: int = 0,
                 dtype: str | None = None, seed: int = 0, kv_cache_memory_bytes: int | None = None,
                 gpu_memory_utilization: float | None = None, enforce_eager: bool | None = None,
                 multiprocessing: bool | None = None, **llm_kwargs):
        self.plan = plan or PrecisionPlan()
        check_plan(self.plan)
        from vllm import LLM
        from vllm.platforms import current_platform

        from trace_rl.vllm_plugin import quantization_config

        self.model_dir = Path(model_dir)
        self.max_batch, self.max_seq_len = max_batch, max_seq_len
        self.pad_token_id, self.policy_version = pad_token_id, policy_version
        self.on_cpu = current_platform.is_cpu()
        self._keep_folder = None
        config = json.loads((self.model_dir / "config.json").read_text())
        # vLLM's "auto" downcasts float32 checkpoints to bf16; the native engine keeps the model's dtype.
        dtype = dtype or config.get("torch_dtype") or config.get("dtype") or "auto"
        kwargs = dict(model=str(self.model_dir), skip_tokenizer_init=True, dtype=dtype, seed=seed,
                      max_model_len=max_seq_len, max_num_seqs=max_batch, generation_config="vllm",
                      logprobs_mode="processed_logprobs", max_logprobs=1,
                      kv_cache_dtype=KV_CACHE_DTYPES[self.plan.kv_cache],
                      enforce_eager=self.on_cpu if enforce_eager is None else enforce_eager,
                      worker_extension_cls=f"{__name__}.TraceWorkerExtension")
        if self.plan.rollout_weights != "bf16" or self.plan.rollout_activations != "bf16":
            kwargs["hf_overrides"] = {"quantization_config": quantization_config(self.plan)}
        if kv_cache_memory_bytes is None and self.on_cpu:
            kv_cache_memory_bytes = _kv_cache_bytes(config, dtype, max_batch, max_seq_len, self.plan.kv_cache)
        if kv_cache_memory_bytes is not None:
            kwargs["kv_cache_memory_bytes"] = kv_cache_memory_bytes
        if gpu_memory_utilization is not None:
            kwargs["gpu_memory_utilization"] = gpu_memory_utilization
        kwargs.update(llm_kwargs)
        if kwargs.get("tensor_parallel_size", 1) > 1 and self.plan.rollout_weights == "nvfp4":
            log.warning("vllm engine: with tensor parallelism each rank quantizes its slice of a weight, so "
                        "nvfp4's per-tensor global scale differs from the native engine's")
        log.info("vllm engine: building vllm.LLM for %s (plan %s, kv_cache_dtype %s)", self.model_dir,
                 self.plan.label, kwargs["kv_cache_dtype"])
        with _env("VLLM_ENABLE_V1_MULTIPROCESSING", None if multiprocessing is None else str(int(multiprocessing))):
            self.llm = LLM(**kwargs)
        self.weight_names = self._checkpoint_names()
        self._rpc_in_process = self._worker_in_process()

    @classmethod
    def from_model(cls, model, tokenizer=None, plan: PrecisionPlan | None = None, folder: str | Path | None = None,
                   **kwargs) -> VLLMEngine:
        """Write a trainer-stage Decoder as an HF folder (`folder`, or a temporary one kept while the engine
        lives) and build the engine on it."""
        from trace_rl.models.loading import save_pretrained

        keep = None
        if folder is None:
            keep = tempfile.TemporaryDirectory(prefix="trace_rl_vllm_")
            folder = keep.name
        save_pretrained(model, tokenizer, folder)
        engine = cls(folder, plan if plan is not None else model.plan, **kwargs)
        engine._keep_folder = keep
        return engine

    def _worker_in_process(self) -> bool:
        """Whether vLLM's engine core and its single worker live in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0
        with the uni executor): then `collective_rpc` arguments are passed by reference."""
        from vllm.v1.engine.core_client import InprocClient

        engine = self.llm.llm_engine
        return (isinstance(engine.engine_core, InprocClient)
                and engine.vllm_config.parallel_config.distributed_executor_backend == "uni")

    def _checkpoint_names(self) -> set[str]:
        from safetensors import safe_open

        from trace_rl.models.loading import _weight_files

        names = set()
        for f in _weight_files(self.model_dir):
            with safe_open(str(f), "pt") as handle:
                names.update(handle.keys())
        return names

    # -- weights --
    @torch.no_grad()
    def load_weights(self, state_dict: Mapping[str, torch.Tensor], version: int) -> None:
        """Send the trainer's tensors (HF names, as in the checkpoint) to vLLM's in-place reload."""
        sd = {k: v for k, v in state_dict.items() if not k.endswith("rotary_emb.inv_freq")}
        if "lm_head.weight" not in self.weight_names:       # tied head: the checkpoint omits it
            sd.pop("lm_head.weight", None)
        missing, unexpected = sorted(self.weight_names - set(sd)), sorted(set(sd) - self.weight_names)
        if missing or unexpected:
            raise KeyError(f"VLLMEngine.load_weights: missing {missing[:8]}, unexpected {unexpected[:8]} "
                           f"(names must be the checkpoint's, as the trainer Decoder's state_dict gives them)")
        if self._rpc_in_process:     # the worker runs in this process: hand it the tensors themselves
            weights = [(k, v.detach()) for k, v in sd.items()]
        else:
            weights = [(k, *encode_tensor(v)) for k, v in sd.items()]
        self.llm.collective_rpc("trace_rl_reload_weights", args=(weights,))
        self.llm.reset_prefix_cache()
        self.policy_version = int(version)

    # -- generation --
    def _vllm_sampling(self, s: SamplingParams):
        from vllm import SamplingParams as VSamplingParams

        greedy = s.temperature == 0
        stops = None if s.ignore_stop or not s.stop_token_ids else list(s.stop_token_ids)
        return VSamplingParams(n=s.n, temperature=s.temperature, top_k=0 if greedy else s.top_k,
                               top_p=1.0 if greedy else s.top_p, max_tokens=s.max_new_tokens, seed=s.seed,
                               stop_token_ids=stops, ignore_eos=True, logprobs=None if greedy else 0,
                               detokenize=False, skip_special_tokens=False)

    @torch.no_grad()
    def generate(self, prompts: TensorDict, sampling: SamplingParams) -> TensorDict:
        from vllm.inputs import TokensPrompt

        tokens = prompts.get(K.TOKENS_PROMPT).cpu()
        mask = prompts.get(K.MASK_PROMPT).cpu().bool()
        lens = mask.sum(1)
        if int(lens.min()) < 1 or not bool((mask == (torch.arange(mask.shape[1]) < lens[:, None])).all()):
            raise ValueError("prompts must be right-padded with at least one token each "
                             "(masks: True for the first len tokens, then False)")
        if int(lens.max()) + sampling.max_new_tokens > self.max_seq_len:
            raise ValueError(f"prompt ({int(lens.max())} tokens) + max_new_tokens ({sampling.max_new_tokens}) "
                             f"exceeds the engine's max_seq_len={self.max_seq_len}; build it with a larger one")
        requests = [TokensPrompt(prompt_token_ids=row[:n].tolist()) for row, n in zip(tokens, lens.tolist())]
        outputs = self.llm.generate(requests, self._vllm_sampling(sampling), use_tqdm=False)
        completions = [c for out in outputs for c in sorted(out.outputs, key=lambda c: c.index)]
        rows, n = len(completions), sampling.n
        if rows != len(requests) * n:
            raise RuntimeError(f"vLLM returned {rows} completions for {len(requests)} prompts x n={n}")
        width = max(1, max(len(c.token_ids) for c in completions))
        resp = torch.full((rows, width), self.pad_token_id, dtype=torch.long)
        logp = torch.zeros(rows, width, dtype=torch.float32)
        ngen = torch.tensor([len(c.token_ids) for c in completions], dtype=torch.long)
        for r, c in enumerate(completions):
            resp[r, : len(c.token_ids)] = torch.tensor(list(c.token_ids), dtype=torch.long)
            if sampling.temperature != 0:
                logp[r, : len(c.token_ids)] = torch.tensor(
                    [step[tok].logprob for tok, step in zip(c.token_ids, c.logprobs)], dtype=torch.float32)
        resp_mask = torch.arange(width)[None, :] < ngen[:, None]
        device = prompts.device if prompts.device is not None else torch.device("cpu")
        # built on the host (where vLLM's outputs were gathered), then moved to the prompts' device
        return rollout_output(
            prompt_tokens=tokens, prompt_mask=mask, prompt_index=torch.arange(rows) // n,
            response_tokens=resp, response_mask=resp_mask, rollout_log_probs=logp, num_generated=ngen,
            policy_version=self.policy_version, device=torch.device("cpu")).to(device)

    def report(self) -> dict:
        """What ran where: the plan, the platform, and each worker's trace_rl backend paths and KV dtype."""
        return {"engine": "vllm", "plan": self.plan.label, "cpu": self.on_cpu, "model_dir": str(self.model_dir),
                "policy_version": self.policy_version, "workers": self.llm.collective_rpc("trace_rl_report")}

    def shutdown(self) -> None:
        """Stop vLLM's engine processes (the garbage collector would, later)."""
        llm = getattr(self, "llm", None)
        if llm is not None and hasattr(llm, "llm_engine"):
            core = getattr(llm.llm_engine, "engine_core", None)
            if core is not None and hasattr(core, "shutdown"):
                core.shutdown()
        self.llm = None
