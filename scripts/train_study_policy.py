"""The stability study's policy (docs/stability.md, "GPU study"): SFT a char-level Qwen3-style decoder from
scratch on worked long multiplication until its held-out greedy accuracy enters the band RL needs (20-60%),
resumable across 10-minute device calls.

    python scripts/train_study_policy.py --work runs/study-sft --policy runs/study-policy --budget 540
    python scripts/train_study_policy.py --smoke --work /tmp/sft --policy /tmp/policy --budget 30   # CPU check

The default recipe (`RECIPES["gpu"]`): 17.4M parameters (8 layers, hidden 384, MLP 1536, 6 query / 2 KV
heads of 64, tied embeddings, vocab 128): the largest shape whose bf16 weights (33 MiB) travel with every
device call beside the code and the wheels (64 MiB in all). Task: `mul` with 3-4 digit operands, worked
(`show_work`): answers of 560-1242 characters (= tokens) ending in `#### <product>` and EOS.

- **Schedule**: AdamW (0.9, 0.95, weight decay 0.1), linear warm-up then cosine decay to 0.1 x lr over
  `max_steps`; bf16 autocast on GPU, fp32 master weights; the batch of step k is a pure function of
  (seed, k), so a resumed SFT sees the same data.
- **Stop**: greedy held-out accuracy (through the native engine in bf16, as RL's evaluations run) every
  `eval_every` steps (a third of that once accuracy passes 10%); SFT stops at the first evaluation at or
  above `target_accuracy` (0.3) and exports the policy. Accuracy above `band[1]` at that point is recorded
  (the study then notes it); at `max_steps` a policy inside the band (>= `band[0]`) is accepted, one below it
  is left unfinished (`done: false, exhausted: true`: make the recipe easier or longer and start again).
- **Resume**: the full state (fp32 weights, AdamW moments, step, evaluations) is an atomic checkpoint in
  `--work` (trace_rl.pipelines.checkpoint): exact resume while the device machine is warm. A fresh machine
  has only the exported bf16 policy (`--policy`, policy.json says the step): SFT then restarts from those
  weights at that step with a fresh optimizer and a 50-step re-warm-up (not exact; recorded as a "warm
  restart" in sft.jsonl).
- **Budget**: `--budget` seconds from the start; the next step (plus its evaluation and a save) must fit,
  else it checkpoints, exports and returns.

Outputs: `--policy` (an HF folder: config.json, generation_config.json, model.safetensors in bf16, tokenizer,
and policy.json: recipe, step, evaluations, accuracy, weights sha256), `--work/sft.jsonl` (loss, lr,
tokens/s every 25 steps; evaluations), `--work/checkpoint/`.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import shutil
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from trace_rl.models.config import ModelConfig  # noqa: E402
from trace_rl.tasks import build_task  # noqa: E402
from trace_rl.tasks.sft import sft_autocast, sft_batch, sft_step  # noqa: E402

_IDS = dict(vocab_size=128, bos_token_id=1, eos_token_id=2, pad_token_id=0, tie_word_embeddings=True, qk_norm=True,
            max_position_embeddings=4096, family="qwen3")
RECIPES = {
    "gpu": {
        "model": dict(hidden_size=384, num_layers=8, intermediate_size=1536, num_heads=6, num_kv_heads=2,
                      head_dim=64, **_IDS),
        "task": {"kind": "arithmetic", "ops": ["mul"], "min_digits": 3, "max_digits": 4, "show_work": True},
        "seed": 0, "batch": 64, "lr": 1e-3, "warmup": 200, "max_steps": 8000, "min_lr_ratio": 0.1,
        "eval_every": 300, "eval_prompts": 128, "target_accuracy": 0.3, "band": [0.2, 0.6],
        "checkpoint_every": 500, "log_every": 25,
    },
    "smoke": {     # the same code path on a CPU in seconds (tests, and a check before a device call)
        "model": dict(hidden_size=64, num_layers=2, intermediate_size=128, num_heads=2, num_kv_heads=2,
                      head_dim=32, **_IDS),       # 2 KV heads: guided K/V records fail with 1 (a bug outside the study)
        "task": {"kind": "arithmetic", "ops": ["add"], "min_digits": 1, "max_digits": 1},
        "seed": 0, "batch": 8, "lr": 3e-3, "warmup": 1, "max_steps": 2, "min_lr_ratio": 0.1,
        "eval_every": 2, "eval_prompts": 8, "target_accuracy": 0.0, "band": [0.0, 1.0],
        "checkpoint_every": 1, "log_every": 1,
    },
}
RESTART_WARMUP = 50


def max_answer_tokens(task) -> int:
    """Longest SFT target (+ EOS) over a large sample of both splits: the rollout's max_new_tokens bound."""
    problems = task.problems(2000, 12345, "train") + task.problems(500, 12345, "eval")
    return max(len(task.sft_target(p)) for p in problems) + 1


def model_config(recipe: dict) -> ModelConfig:
    return ModelConfig(**recipe["model"])


def encode_batch(task, tok, problems, device):
    """prompt + target (+ EOS when the task has no stop string), right-padded; loss mask over the target."""
    tokens, mask = sft_batch(task, tok, problems, eos=not task.stop_strings)
    if device.type == "cuda":          # built in a worker thread while the GPU runs the previous step
        return tokens.pin_memory().to(device, non_blocking=True), mask.pin_memory().to(device, non_blocking=True)
    return tokens, mask


def lr_at(recipe: dict, step: int, restart_step: int | None) -> float:
    """Warm-up, cosine to min_lr_ratio at max_steps; after a warm restart, a RESTART_WARMUP-step ramp."""
    warm, total, floor = recipe["warmup"], recipe["max_steps"], recipe["min_lr_ratio"]
    if step < warm:
        scale = (step + 1) / warm
    else:
        frac = min(1.0, (step - warm) / max(1, total - warm))
        scale = floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * frac))
    if restart_step is not None and step - restart_step < RESTART_WARMUP:
        scale *= (step - restart_step + 1) / RESTART_WARMUP
    return recipe["lr"] * scale


class Evaluator:
    """Greedy held-out accuracy through the native engine in bf16 (one engine, weights re-synced per call)."""

    def __init__(self, model, tok, task, recipe: dict, device, max_new_tokens: int):
        from trace_rl.audit.inputs import encode_prompts
        from trace_rl.engine.base import SamplingParams
        from trace_rl.engine.native import NativeEngine
        from trace_rl.pipelines.assemble import stop_token_ids

        self.task, self.tok = task, tok
        self.problems = task.problems(recipe["eval_prompts"], recipe["seed"], "eval")
        self.prompts = encode_prompts([p.prompt for p in self.problems], tok)
        longest = max(int(m.sum()) for m in self.prompts.get(("masks", "prompt")))
        self.engine = NativeEngine(model, None, max_batch=len(self.problems), max_seq_len=longest + max_new_tokens,
                                   device=device, pad_token_id=tok.pad_token_id)
        self.sampling = SamplingParams(n=1, temperature=0.0, max_new_tokens=max_new_tokens,
                                       stop_token_ids=stop_token_ids(task, tok))

    @torch.no_grad()
    def __call__(self, model, step: int) -> dict:
        from trace_rl.data import schema as K

        t0 = time.perf_counter()
        self.engine.load_weights(model.state_dict(), step)
        out = self.engine.generate(self.prompts, self.sampling)
        tokens, mask = out.get(K.TOKENS_RESPONSE), out.get(K.MASK_RESPONSE)
        scores = [self.task.score(p, self.tok.decode(row[m].tolist()))
                  for p, row, m in zip(self.problems, tokens, mask)]
        n = len(scores)
        return {"kind": "eval", "step": step, "accuracy": sum(s.correct for s in scores) / n,
                "format_ok": sum(s.format_ok for s in scores) / n,
                "mean_length": float(mask.sum(-1).float().mean()), "seconds": time.perf_counter() - t0}


def weights_sha256(folder: Path) -> str:
    return hashlib.sha256((Path(folder) / "model.safetensors").read_bytes()).hexdigest()


def export_policy(model, tok, recipe: dict, policy_dir: Path, info: dict, max_new_tokens: int) -> dict:
    """The bf16 HF folder + policy.json, written to a temporary folder and renamed over the old one."""
    from trace_rl.engine.base import SamplingParams
    from trace_rl.models.loading import save_pretrained

    policy_dir = Path(policy_dir)
    tmp = policy_dir.with_name(policy_dir.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    greedy = SamplingParams(temperature=0.0, max_new_tokens=max_new_tokens, stop_token_ids=(tok.eos_token_id,))
    save_pretrained(model, tok, tmp, sampling=greedy, dtype=torch.bfloat16)
    info = {**info, "recipe": recipe, "params": model.config.num_params, "max_new_tokens": max_new_tokens,
            "weights_sha256": weights_sha256(tmp)}
    (tmp / "policy.json").write_text(json.dumps(info, indent=2))
    old = policy_dir.with_name(policy_dir.name + ".old")
    if policy_dir.exists():
        if old.exists():
            shutil.rmtree(old)
        policy_dir.rename(old)
    tmp.rename(policy_dir)
    if old.exists():
        shutil.rmtree(old)
    return info


def read_policy_info(policy_dir: Path) -> dict | None:
    f = Path(policy_dir) / "policy.json"
    return json.loads(f.read_text()) if f.is_file() else None


def train(recipe: dict, work: Path, policy_dir: Path, deadline: float | None = None, device=None, log=print) -> dict:
    """SFT until the target accuracy, `max_steps` or the deadline (time.time()); returns policy.json's content."""
    from trace_rl.models.decoder import build
    from trace_rl.models.loading import load_state_dict_into, read_state_dict
    from trace_rl.models.presets import char_tokenizer_for
    from trace_rl.pipelines.checkpoint import (
        CheckpointError,
        check_same_run,
        find_checkpoint,
        load_named_optimizer_state,
        named_optimizer_state,
        read_checkpoint,
        save_checkpoint,
    )

    work, policy_dir = Path(work), Path(policy_dir)
    work.mkdir(parents=True, exist_ok=True)
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    task = build_task(recipe["task"])
    max_new = max_answer_tokens(task) + 16
    config = model_config(recipe)
    tok = char_tokenizer_for(config)
    torch.manual_seed(recipe["seed"])
    model = build(config, device=device, dtype=torch.float32).init_random(
        generator=torch.Generator(device=device).manual_seed(recipe["seed"]))
    opt = torch.optim.AdamW(model.parameters(), lr=recipe["lr"], betas=(0.9, 0.95), weight_decay=0.1,
                            fused=device.type == "cuda")
    state = {"step": 0, "evals": [], "restart_step": None, "done": False}
    journal = (work / "sft.jsonl").open("a")

    def note(entry: dict) -> None:
        journal.write(json.dumps(entry) + "\n")
        journal.flush()

    try:
        found = find_checkpoint(work)
    except CheckpointError:
        found = None
    info = read_policy_info(policy_dir)
    if found is not None:                     # warm machine: exact resume
        check_same_run(found.state, recipe, found.folder)      # another recipe's checkpoint: CheckpointError
        weights, optim, _, saved = read_checkpoint(found.folder)
        load_state_dict_into(model, {k: v.to(device) for k, v in weights.items()})
        optim["state"] = {k: {n: v.to(device) if torch.is_tensor(v) and n != "step" else v for n, v in e.items()}
                          for k, e in optim["state"].items()}
        load_named_optimizer_state(model, opt, optim, str(found.folder))
        state = saved["sft"]
        note({"kind": "resume", "step": state["step"], "from": found.note})
    elif info is not None:                    # fresh machine: the exported bf16 policy
        if info.get("recipe") != recipe:
            raise ValueError(f"{policy_dir}: exported by another SFT recipe; use another --policy folder")
        load_state_dict_into(model, read_state_dict(policy_dir, device))
        state = {"step": info["step"], "evals": info["evals"], "restart_step": info["step"], "done": info["done"]}
        note({"kind": "warm_restart", "step": state["step"], "from": str(policy_dir)})
    if state["done"] and info is not None and info["step"] == state["step"]:
        journal.close()
        return info
    log(f"sft: {config.num_params / 1e6:.1f}M params on {device}, task {recipe['task']}, answers <= {max_new} "
        f"tokens, from step {state['step']}")

    evaluator = Evaluator(model, tok, task, recipe, device, max_new)
    autocast = sft_autocast(device)
    seed = recipe["seed"]

    def make_batch(step):
        return encode_batch(task, tok, task.problems(recipe["batch"], seed * 7919 + step, "train"), device)

    step_times, eval_times, save_times = [], [], []
    pool = ThreadPoolExecutor(1)
    pending = pool.submit(make_batch, state["step"])
    t_log, tokens_since = time.perf_counter(), 0

    def eval_due(step: int) -> bool:
        every = recipe["eval_every"]
        if state["evals"] and state["evals"][-1]["accuracy"] >= 0.1:
            every = max(1, every // 3)
        return step % every == 0 or step == recipe["max_steps"]

    def save():
        t0 = time.perf_counter()
        save_checkpoint(work, model.state_dict(), named_optimizer_state(model, opt), {"step": state["step"],
                        "sft": state}, recipe, hf_model=model, tokenizer=tok)
        save_times.append(time.perf_counter() - t0)

    model.train()
    try:
        while state["step"] < recipe["max_steps"] and not state["done"]:
            if deadline is not None and step_times:
                need = 1.1 * max(step_times[-5:]) + (max(eval_times) if eval_times and eval_due(state["step"] + 1)
                                                     else 0.0) + (max(save_times) if save_times else 5.0)
                if time.time() + need > deadline:
                    note({"kind": "deadline", "step": state["step"]})
                    break
            t0 = time.perf_counter()
            step = state["step"]
            for group in opt.param_groups:
                group["lr"] = lr_at(recipe, step, state["restart_step"])
            tokens, mask = pending.result()
            pending = pool.submit(make_batch, step + 1)
            loss, grad_norm = sft_step(model, opt, tokens, mask, autocast)
            state["step"] = step + 1
            tokens_since += int(mask.sum())
            if state["step"] % recipe["log_every"] == 0 or state["step"] == 1:
                loss_v, gn = loss.item(), grad_norm.item()
                if not (math.isfinite(loss_v) and math.isfinite(gn)):
                    raise FloatingPointError(f"sft step {state['step']}: loss {loss_v}, grad norm {gn}")
                now = time.perf_counter()
                note({"kind": "train", "step": state["step"], "loss": loss_v, "grad_norm": gn,
                      "lr": opt.param_groups[0]["lr"], "tokens_per_s": tokens_since / max(now - t_log, 1e-9)})
                t_log, tokens_since = now, 0
            if device.type == "cuda":
                torch.cuda.synchronize()
            step_times.append(time.perf_counter() - t0)
            if eval_due(state["step"]):
                model.eval()
                entry = evaluator(model, state["step"])
                model.train()
                eval_times.append(entry["seconds"])
                state["evals"].append({k: entry[k] for k in ("step", "accuracy", "format_ok", "mean_length")})
                note(entry)
                log(f"sft step {state['step']}: held-out greedy accuracy {entry['accuracy']:.3f} (format "
                    f"{entry['format_ok']:.2f}, {entry['seconds']:.1f}s)")
                state["done"] = entry["accuracy"] >= recipe["target_accuracy"] or (
                    state["step"] >= recipe["max_steps"] and entry["accuracy"] >= recipe["band"][0])
            if state["step"] % recipe["checkpoint_every"] == 0 and not state["done"]:
                save()
    finally:
        pool.shutdown(wait=True)
        journal.close()
    model.eval()
    save()
    last = state["evals"][-1]["accuracy"] if state["evals"] else None
    lo, hi = recipe["band"]
    info = export_policy(model, tok, recipe, policy_dir, {
        "step": state["step"], "done": state["done"], "evals": state["evals"], "accuracy": last,
        "in_band": last is not None and lo <= last <= hi,
        "exhausted": state["step"] >= recipe["max_steps"] and not state["done"]}, max_new)
    log(f"sft: step {state['step']}, accuracy {last}, done {state['done']}; policy in {policy_dir}")
    return info


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", type=Path, required=True, help="SFT state (checkpoint/, sft.jsonl)")
    ap.add_argument("--policy", type=Path, required=True, help="where the bf16 policy is exported")
    ap.add_argument("--recipe", choices=sorted(RECIPES), default="gpu")
    ap.add_argument("--smoke", action="store_true", help="the smoke recipe (CPU, seconds)")
    ap.add_argument("--budget", type=float, default=None, help="seconds from now to stop by")
    ap.add_argument("--device", choices=("cpu", "cuda"), default=None)
    args = ap.parse_args()
    recipe = RECIPES["smoke" if args.smoke else args.recipe]
    deadline = None if args.budget is None else time.time() + args.budget
    info = train(recipe, args.work, args.policy, deadline, args.device)
    print(json.dumps({k: v for k, v in info.items() if k not in ("recipe", "evals")}, indent=1))


if __name__ == "__main__":
    main()
