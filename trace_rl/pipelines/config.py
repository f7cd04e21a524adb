"""`PipelineConfig`: one pydantic config for a whole RL run (YAML/TOML), the typed tree of its objects.

collector (engine + prompts + task reward) -> replay buffer -> trainer log-probs -> corrections -> loss ->
optimizer -> weight sync. Every field is documented; unknown keys are errors naming the key.
"""

from __future__ import annotations

import importlib.util
from typing import Literal

from pydantic import Field, field_validator, model_validator

from trace_rl.config import TraceConfig
from trace_rl.correction.registry import CorrectionConfig
from trace_rl.data.advantages import GroupAdvantageConfig
from trace_rl.distributed.config import DistributedSection
from trace_rl.objectives.config import LossConfig
from trace_rl.pipelines.collapse import CollapseSection
from trace_rl.pipelines.schedules import LRScheduleSection
from trace_rl.plan import PrecisionPlan
from trace_rl.tasks.config import ArithmeticConfig, TaskConfig

MAX_SEED = 2**32 - 1       # seeds are offset per step and batch; torch generators take at most 64 bits
DEFAULT_MODEL = "default"   # the embedded char-level policy shipped in trace_rl/assets


class ModelSection(TraceConfig):
    """Which policy to train: the embedded default, a random-init preset, or a local HF-format folder."""

    preset: str | None = Field(
        DEFAULT_MODEL, description="'default' (the embedded SFT'd char-level policy) or a model preset "
                                   "('tiny', 'tiny-llama', 'tiny-moe': random init). Ignored when `path` is set.")
    path: str | None = Field(None, description="Local HF-format folder (config.json + safetensors + tokenizer).")
    dtype: Literal["float32", "bfloat16"] = Field(
        "float32", description="Trainer parameter dtype (the rollout engine casts to its own on GPU).")
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="'auto': cuda when present, else cpu.")
    cpu_threads: int | None = Field(
        1, ge=1, description="torch CPU threads when running on the CPU (1 is fastest for the tiny presets: "
                             "their matmuls are too small to split; None keeps torch's default).")
    router_replay: bool | None = Field(
        None, description="Mixture-of-experts models: the trainer's forward routes each token to the experts the "
                          "rollout recorded (its own router probabilities renormalised over them). None: on for "
                          "MoE models; true on a dense model is an error.")
    router_aux_loss_coef: float = Field(
        0.0, ge=0.0, description="Mixture-of-experts models: weight of transformers' auxiliary load-balancing "
                                 "loss added to the policy loss (0: off, the RL default).")


class SamplingSection(TraceConfig):
    """Rollout sampling. The group size (responses per prompt) is `loop.group_size`."""

    temperature: float = Field(1.0, ge=0.0, description="Softmax temperature (0: greedy).")
    top_k: int = Field(0, ge=0, description="Keep the k most likely tokens (0: all).")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="Nucleus mass (1.0: all).")
    max_new_tokens: int = Field(16, ge=1, description="Most tokens per response.")


class RolloutSection(TraceConfig):
    """The rollout engine and how it samples."""

    engine: Literal["native", "hf", "recompute", "vllm"] = Field(
        "native", description="native (ours: paged quantized KV cache), hf (transformers generate, bf16 plan "
                              "only), recompute (full re-forward per token: slow exact reference), vllm.")
    sampling: SamplingSection = Field(default_factory=SamplingSection, description="Sampling parameters.")
    max_batch: int = Field(64, ge=1, description="Sequences decoded at once (native engine slots).")
    max_seq_len: int = Field(256, ge=8, description="Prompt + response tokens per sequence (KV-cache size).")
    attention: Literal["auto", "kernels", "gluon", "reference"] = Field(
        "auto", description="Native engine's decode attention: 'auto' (times the candidates per batch and context, "
                            "picks the fastest), 'kernels' (the Triton paged kernel), 'gluon' (the Gluon "
                            "kernel, which 'auto' also times where it can run: precision.kv_cache 'nvfp4' or 'mxfp4', "
                            "head_dim 128, an sm_90 GPU with Triton 3.6; forced, an error elsewhere, never a "
                            "fallback), 'reference' (torch gather + dequantize: slow). "
                            "The bf16 torch paths need slot-contiguous pages, which the run's page pool is not. "
                            "The bf16 evaluation engine (loop.eval_reference) keeps 'auto'.")
    operand_cache: bool | Literal["bf16", "fp8"] = Field(
        False, description="Native engine, FP4 weights, a CUDA GPU: keep each dense FP4 linear's bf16 operand "
                           "(refreshed at every weight sync) so decode steps of >= 128 rows run cuBLAS on it without "
                           "dequantizing; costs 2 bytes per weight element (Qwen3-8B: ~14 GB) on top of the FP4 "
                           "weights. Same results as without it. true = 'bf16'. 'fp8' (mxfp4 W4A4 plans, e.g. "
                           "w4a4-kv4-mx): the operand as float8_e4m3fn (exact: mxfp4 values are E2M1 codes x powers "
                           "of two; 1 byte per element) and FP8 tensor-core GEMMs on E4M3 activations; same values, "
                           "only the float32 accumulation differs (docs/kernels.md, FP8 operand cache).")


class ReferenceSection(TraceConfig):
    """The reference policy of the KL term (used when trainer.loss.kl_to_ref_coeff > 0): a frozen copy of the
    initial policy."""

    device: Literal["same", "cpu"] = Field("same", description="'same': beside the policy; 'cpu': in host "
                                                                "memory (frees accelerator memory, slower).")
    dtype: Literal["same", "float32", "bfloat16"] = Field(
        "same", description="'same' as the policy, or a cast (bfloat16 halves its memory).")


class TrainerSection(TraceConfig):
    """Optimisation of the policy."""

    optimizer: Literal["adamw", "sgd"] = Field("adamw", description="Optimizer.")
    lr: float = Field(1e-4, gt=0, description="Learning rate (the peak, with a schedule).")
    lr_schedule: LRScheduleSection = Field(default_factory=LRScheduleSection,
                                           description="Warmup and decay of the learning rate over loop.steps.")
    weight_decay: float = Field(0.0, ge=0, description="Decoupled weight decay (AdamW).")
    betas: tuple[float, float] = Field((0.9, 0.99), description="AdamW betas (each in [0, 1)).")
    epochs_per_batch: int = Field(1, ge=1, description="Optimizer passes over each collected batch.")
    micro_batch_size: int = Field(64, ge=1, description="Rows per forward/backward (gradient accumulation).")
    grad_clip: float | None = Field(1.0, gt=0, description="Max global gradient norm (None: no clipping).")
    loss: LossConfig = Field(default_factory=LossConfig, description="The GRPO-family objective.")
    advantage: GroupAdvantageConfig = Field(default_factory=GroupAdvantageConfig,
                                            description="How rewards become advantages.")
    reference: ReferenceSection = Field(default_factory=ReferenceSection,
                                        description="Where the reference policy of the KL term runs.")

    @field_validator("betas")
    @classmethod
    def _betas_in_range(cls, v: tuple[float, float]) -> tuple[float, float]:
        for i, b in enumerate(v):
            if not 0.0 <= b < 1.0:
                raise ValueError(f"betas[{i}] = {b} is outside [0, 1): Adam's moving averages need 0 <= beta < 1 "
                                 f"(typical: [0.9, 0.99])")
        return v


class LoopSection(TraceConfig):
    """How long and how much per step."""

    steps: int = Field(40, ge=1, description="Training steps (one collected batch each).")
    prompts_per_step: int = Field(16, ge=1, description="Prompts sampled per step.")
    group_size: int = Field(8, description="Responses per prompt (the GRPO group; at least 2: group-relative "
                                           "advantages compare the responses to one prompt).")
    max_staleness: int | None = Field(
        0, ge=0, description="Replay buffer drops groups more than this many policy versions old.")
    eval_every: int = Field(10, ge=0, description="Evaluate on held-out prompts every N steps (0: only at the "
                                                  "start and the end).")
    eval_prompts: int = Field(128, ge=1, description="Held-out prompts per evaluation (greedy decoding).")
    eval_reference: bool = Field(
        False, description="Also evaluate the same held-out prompts greedily at bf16 (a second, bf16 native engine "
                           "loaded with the trainer's weights at each evaluation), logged as eval_ref_accuracy, "
                           "eval_ref_reward, eval_ref_format_ok, eval_ref_seconds beside the plan's own eval_*: "
                           "separates a quantized plan's less accurate inference from what its rollouts did to "
                           "training. Costs a bf16 copy of the model and a KV cache of min(rollout.max_batch, "
                           "eval_prompts) sequences, and a second greedy pass per evaluation. No effect when the "
                           "rollout is already bf16 (precision not quantized): nothing is evaluated twice.")
    checkpoint_every: int = Field(10, ge=0, description="Save a checkpoint every N steps, and always after the last "
                                                        "step and on SIGINT/SIGTERM (0: only then).")
    keep_models: int = Field(
        0, ge=0, description="Also keep the HF model folders of the last N checkpoints as <run>/models/step-<N>/ "
                             "(hard links, for `trace-rl export --step`); 0: only the latest checkpoint.")
    masked_alarm: float = Field(
        0.99, gt=0.0, le=1.0, description="Warn (log and progress bar) when the corrections mask or reject at "
                                          "least this share of a step's tokens: that step learns (almost) nothing.")
    stop_when_masked: bool = Field(
        False, description="Stop the run (exit 1, after saving a checkpoint) at such a step instead of warning.")
    collapse: CollapseSection = Field(
        default_factory=CollapseSection, description="When the run counts as collapsed (held-out accuracy, "
                                                     "entropy, non-finite values); recorded in metrics.jsonl.")

    @field_validator("group_size")
    @classmethod
    def _group_of_two(cls, v: int) -> int:
        if v < 2:
            raise ValueError(f"must be at least 2, got {v}: a group of one response has no baseline, so every "
                             f"advantage would be 0 and nothing would be learned")
        return v


LoggerName = Literal["csv", "tensorboard", "wandb", "mlflow"]


class WandbSection(TraceConfig):
    """Weights & Biases (logging.loggers: [wandb])."""

    project: str = Field("trace-rl", description="W&B project.")
    entity: str | None = Field(None, description="W&B entity (team or user; None: your default).")
    mode: Literal["offline", "online"] = Field(
        "offline", description="offline: the run stays in <run>/wandb/ (`wandb sync` uploads it later); "
                               "online: streamed to the W&B server (needs `wandb login`).")


class MLflowSection(TraceConfig):
    """MLflow (logging.loggers: [mlflow])."""

    tracking_uri: str | None = Field(None, description="MLflow tracking URI (None: a file store in <run>/mlruns).")
    experiment: str = Field("trace-rl", description="MLflow experiment the run is logged under.")


class LoggingSection(TraceConfig):
    """Where the run writes."""

    dir: str = Field("runs", description="Parent folder of run directories.")
    name: str | None = Field(None, description="Run directory name inside `dir` (None: <preset-or-plan>-<timestamp>); "
                                               "one path component: no '/', '\\' or '..'.")
    jsonl: bool = Field(True, description="Write metrics.jsonl (one JSON object per step).")
    loggers: tuple[LoggerName, ...] = Field(
        (), description="torchrl loggers that also receive every metric, under train/, rollout/, drift/ and "
                        "eval/: csv (<run>/csv/), tensorboard (<run>/tensorboard/), wandb, mlflow. A missing "
                        "package is an error.")
    tensorboard: bool = Field(False, description="Same as adding 'tensorboard' to loggers (older configs).")
    wandb: WandbSection = Field(default_factory=WandbSection, description="W&B options (loggers: [wandb]).")
    mlflow: MLflowSection = Field(default_factory=MLflowSection, description="MLflow options (loggers: [mlflow]).")
    progress: bool = Field(True, description="Show a progress bar with reward, accuracy and mismatch.")
    plot: bool = Field(True, description="Write curves.png (reward/accuracy, mismatch_k3, ess over steps).")

    @property
    def logger_names(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys([*self.loggers, *(["tensorboard"] if self.tensorboard else [])]))

    @model_validator(mode="after")
    def _logger_packages(self) -> LoggingSection:
        from trace_rl.pipelines.loggers import missing_logger_packages

        missing = missing_logger_packages(self.logger_names)
        if missing:
            raise ValueError(f"logging.loggers needs packages that are not installed: {', '.join(missing)}; "
                             f"install them or remove those loggers")
        if self.plot and importlib.util.find_spec("matplotlib") is None:
            raise ValueError("logging.plot draws curves.png with matplotlib, which is not installed: "
                             "pip install matplotlib, or set logging.plot=false")
        return self

    @field_validator("name")
    @classmethod
    def _one_component(cls, v: str | None) -> str | None:
        if v is not None and (not v.strip() or "/" in v or "\\" in v or ".." in v or v.startswith("~")
                              or "\0" in v):
            raise ValueError(f"{v!r} is not a plain folder name: a run name is one path component inside "
                             f"logging.dir (no '/', '\\', '..', '~'); to write elsewhere set logging.dir or "
                             f"pass --out")
        return v


class PipelineConfig(TraceConfig):
    """A whole RL run. `trace-rl run CONFIG`, or `trace_rl.pipelines.build(cfg).run()` from Python."""

    seed: int = Field(0, ge=0, le=MAX_SEED, description="Seed of model init (presets), prompts, sampling and the "
                                                        "trainer (0 .. 2**32 - 1).")
    model: ModelSection = Field(default_factory=ModelSection, description="The policy.")
    task: TaskConfig = Field(default_factory=ArithmeticConfig, description="The verifiable task (kind: ...).")
    precision: PrecisionPlan = Field(default_factory=PrecisionPlan,
                                     description="Formats per stage: rollout weights/activations/KV, trainer.")
    rollout: RolloutSection = Field(default_factory=RolloutSection, description="Engine and sampling.")
    trainer: TrainerSection = Field(default_factory=TrainerSection, description="Optimisation.")
    corrections: tuple[CorrectionConfig, ...] = Field(
        (), description="Drift corrections applied in order (weights multiply, masks AND): "
                        "[{kind: token_tis, params: {C: 2.0}}, ...].")
    loop: LoopSection = Field(default_factory=LoopSection, description="Steps and batch sizes.")
    logging: LoggingSection = Field(default_factory=LoggingSection, description="Outputs.")
    distributed: DistributedSection = Field(
        default_factory=DistributedSection, description="Scale-out: FSDP2 trainer ranks, Ray rollout workers, "
                                                        "async overlap (default: one process).")

    @model_validator(mode="after")
    def _check(self) -> PipelineConfig:
        if self.rollout.engine == "hf" and self.precision.is_quantized:
            raise ValueError(f"rollout.engine='hf' runs transformers' own bf16 model; precision "
                             f"{self.precision.label!r} needs engine 'native' (or 'vllm')")
        if self.rollout.attention != "auto" and self.rollout.engine != "native":
            raise ValueError(f"rollout.attention={self.rollout.attention!r} chooses the native engine's decode "
                             f"attention; rollout.engine is {self.rollout.engine!r}: set rollout.attention='auto' "
                             f"or rollout.engine='native'")
        if self.rollout.attention == "gluon" and self.precision.kv_cache not in ("nvfp4", "mxfp4"):
            raise ValueError(f"rollout.attention='gluon' reads nvfp4 or mxfp4 KV caches only; precision.kv_cache is "
                             f"{self.precision.kv_cache!r}: set precision.kv_cache='nvfp4' or 'mxfp4' (e.g. --preset "
                             f"w4a4-kv4) or rollout.attention='kernels'/'auto'")
        if self.rollout.operand_cache:
            from trace_rl.plan import format_family

            if self.rollout.engine != "native":
                raise ValueError(f"rollout.operand_cache is the native engine's; rollout.engine is "
                                 f"{self.rollout.engine!r}: set rollout.operand_cache=false or rollout.engine='native'")
            if format_family(self.precision.rollout_weights) != "fp4":
                raise ValueError(f"rollout.operand_cache holds the bf16 operand of FP4 weights; "
                                 f"precision.rollout_weights is {self.precision.rollout_weights!r}: use an nvfp4/mxfp4 "
                                 f"plan (e.g. --preset w4a4-kv4) or set rollout.operand_cache=false")
            mx = (self.precision.rollout_weights, self.precision.rollout_activations) == ("mxfp4", "mxfp4")
            if self.rollout.operand_cache == "fp8" and not mx:
                raise ValueError(f"rollout.operand_cache='fp8' holds mxfp4 operands exactly in E4M3 and multiplies "
                                 f"W4A4 mxfp4 activations; precision has {self.precision.rollout_weights!r} weights "
                                 f"and {self.precision.rollout_activations!r} activations (nvfp4 values need 5 "
                                 f"significant bits, bf16 activations are not E4M3 values): use an mxfp4 W4A4 plan "
                                 f"(e.g. --preset w4a4-kv4-mx) or rollout.operand_cache='bf16'")
        if self.loop.eval_reference and self.distributed.enabled:
            raise ValueError("loop.eval_reference: the bf16 reference evaluation needs the trainer's full weights "
                             "in this process, which a distributed run shards; set loop.eval_reference=false or "
                             "run on one process (distributed.enabled false)")
        if self.trainer.lr_schedule.warmup_steps >= self.loop.steps:
            raise ValueError(f"trainer.lr_schedule.warmup_steps={self.trainer.lr_schedule.warmup_steps} leaves no "
                             f"step after the warmup (loop.steps={self.loop.steps}); lower it")
        return self
