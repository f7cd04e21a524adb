"""One RL step of the stability study's shape through the Pipeline, per plan: where a guided step's time goes.

The GPU study (benchmarks/stability_spec.py, preset gpu) trains a 105M char-level decoder (14 layers, hidden
768, MLP 2560, 12 / 4 heads of 64, tied) in float32 on 16 prompts x 8 samples of ~1100-token answers, in
micro-batches of 64. This builds that pipeline on a random-init model of the same shape (the default arithmetic
task; no stop tokens, so every answer runs to --max-new), runs --warmup steps, then --steps steps split into the
phases `Pipeline.train_step` runs: collect (rollout + rewards + replay buffer), draw (the buffer's sample:
densify), score (trainer log-probs, no grad), optimize (loss forward/backward + AdamW), sync (weights to the
engine). Per step: the phases' seconds, peak GPU memory, the guided records' bytes and the trainer's copies
of them. `guided_overhead.py` times the trainer with records already on the GPU; this is the path a run takes
(records in pinned host memory, through the replay buffer, to the GPU per micro-batch).

For guided plans it also times, on this host, stacking one step's records the way the replay buffer did before
they were one tensor per row (`per_site_stack_s`: one torch.stack per site and field, of strided per-row views;
measured on --old-rows rows and scaled to the batch), the cost that made the study's guided steps ~5x aligned.

    python benchmarks/guided_step.py --plans fp4-aligned,fp4-guided --out guided_step.json
    python benchmarks/guided_step.py --layers 2 --hidden 128 --mlp 256 --max-new 32 --prompts 2 --device cpu  # smoke
"""

from __future__ import annotations

import argparse
import gc
import json
import time
from pathlib import Path

import torch

from trace_rl.backends import get_backend
from trace_rl.data import schema as K
from trace_rl.models import presets as model_presets
from trace_rl.models.config import ModelConfig
from trace_rl.pipelines import PipelineConfig, apply_preset, build, default_config

PRESET = "guided-step-study"


def study_model(layers: int, hidden: int, mlp: int) -> ModelConfig:
    return ModelConfig(family="qwen3", vocab_size=128, hidden_size=hidden, intermediate_size=mlp, num_layers=layers,
                       num_heads=hidden // 64, num_kv_heads=max(1, hidden // 192), head_dim=64,
                       max_position_embeddings=4096, tie_word_embeddings=True, qk_norm=True, bos_token_id=1,
                       eos_token_id=2, pad_token_id=0)


def make_pipeline(plan: str, args, run_dir: Path):
    data = apply_preset(default_config().to_dict(), plan)
    cfg = PipelineConfig.parse(data).with_overrides({
        "model.preset": PRESET, "model.dtype": "float32", "model.device": args.device,
        "rollout.max_batch": args.prompts * args.group, "rollout.sampling.max_new_tokens": args.max_new,
        "rollout.max_seq_len": args.max_new + 32, "loop.prompts_per_step": args.prompts,
        "loop.group_size": args.group, "trainer.micro_batch_size": args.micro_batch, "trainer.lr": 2e-5,
        "loop.eval_every": 0, "loop.eval_reference": False, "logging.progress": False, "logging.plot": False})
    pipe = build(cfg, run_dir=run_dir)
    pipe.sampling = pipe.sampling.model_copy(update={"stop_token_ids": ()})   # full-length answers
    pipe.collector.sampling = pipe.sampling
    return pipe


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def phased_step(pipe, device: torch.device) -> tuple[dict, object]:
    """`Pipeline.train_step`'s pieces, timed one by one (GPU synchronized after each)."""
    times, t = {}, time.perf_counter()

    def lap(name: str) -> None:
        nonlocal t
        sync(device)
        now = time.perf_counter()
        times[name], t = now - t, now

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    batch = pipe.collect_batch()
    lap("collect")
    sample = pipe.draw_sample(batch)
    lap("draw")
    pipe.score_sample(sample)
    lap("score")
    pipe.model.train()
    pipe.optimize(sample)
    pipe.model.eval()
    lap("optimize")
    pipe.step += 1
    pipe.sync_weights()
    lap("sync")
    times["total"] = sum(times.values())
    entry = {"seconds": times, "rows": batch.batch_size[0],
             "response_tokens": int(batch.get(K.MASK_RESPONSE).sum()),
             "packed_width": batch.get(K.TOKENS_PROMPT).shape[1] + batch.get(K.TOKENS_RESPONSE).shape[1]}
    if device.type == "cuda":
        entry["peak_gpu_GB"] = torch.cuda.max_memory_allocated(device) / 2**30
    if K.GUIDANCE in batch.keys():
        records = sample.get(K.GUIDANCE_BYTES)
        entry["record_GB"] = records.numel() / 1e9
        entry["record_bytes_per_token"] = records.shape[-1]
        entry["sample_records_pinned"] = records.device.type == "cpu" and records.is_pinned()
    return entry, batch


def per_site_stack_seconds(pipe, batch, rows: int) -> dict:
    """The former replay-buffer stack of one step's records: per site and field, a torch.stack of each row's
    strided view (what densify did when the records were per-site views of the host rows)."""
    packed = batch.get(K.GUIDANCE_BYTES)
    rows = min(rows, packed.shape[0])
    sites = set(pipe.engine.guidance_sites.values())
    t0 = time.perf_counter()
    for site in sites:
        per_row = [site.views(packed[i]) for i in range(rows)]
        for field in per_row[0]:
            torch.stack([v[field] for v in per_row])
    seconds = time.perf_counter() - t0
    leaves = sum(len(site.views(packed[0])) for site in sites)
    return {"rows_timed": rows, "leaves": leaves, "seconds_timed": seconds,
            "per_site_stack_s": seconds * packed.shape[0] / rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--plans", default="fp4-aligned,fp4-guided")
    ap.add_argument("--layers", type=int, default=14)
    ap.add_argument("--hidden", type=int, default=768)
    ap.add_argument("--mlp", type=int, default=2560)
    ap.add_argument("--max-new", type=int, default=1024)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--micro-batch", type=int, default=64)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--old-rows", type=int, default=16, help="rows of the former per-site stack to time")
    ap.add_argument("--deadline-s", type=float, default=0, help="start no new step after this many seconds")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--out", default="guided_step.json")
    ap.add_argument("--run-dir", default="/tmp/guided_step_runs")
    args = ap.parse_args()
    device = torch.device(args.device)
    t_start = time.perf_counter()
    model_presets.PRESETS[PRESET] = study_model(args.layers, args.hidden, args.mlp)
    report = {"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu", "torch": torch.__version__,
              "args": vars(args), "params_M": model_presets.PRESETS[PRESET].num_params / 1e6, "plans": {},
              "errors": []}
    out = Path(args.out)

    def save() -> None:
        report["wall_s"] = time.perf_counter() - t_start
        out.write_text(json.dumps(report, indent=1))

    def late() -> bool:
        return bool(args.deadline_s) and time.perf_counter() - t_start > args.deadline_s

    for plan in args.plans.split(","):
        if late():
            report["errors"].append(f"{plan}: skipped, past the deadline")
            break
        entry = report["plans"][plan] = {"warmup": [], "steps": []}
        get_backend("fp4").paths.counts.clear()
        pipe = batch = None
        try:
            t0 = time.perf_counter()
            pipe = make_pipeline(plan, args, Path(args.run_dir) / plan)
            entry["build_s"] = time.perf_counter() - t0
            for _ in range(args.warmup):
                record = pipe.train_step()
                entry["warmup"].append({k: record[k] for k in ("step_seconds", "rollout_seconds")})
                save()
            for _ in range(args.steps):
                if late():
                    report["errors"].append(f"{plan}: fewer steps, past the deadline")
                    break
                step, batch = phased_step(pipe, device)
                entry["steps"].append(step)
                print(plan, json.dumps(step), flush=True)
                save()
            if batch is not None and K.GUIDANCE in batch.keys() and not late():   # None: no step before the deadline
                entry["former_layout"] = per_site_stack_seconds(pipe, batch, args.old_rows)
                print(plan, "former per-site stack", json.dumps(entry["former_layout"]), flush=True)
            entry["fake_quant_paths"] = {k: v for k, v in get_backend("fp4").paths.counts.items() if "fake" in k}
        except Exception as e:  # noqa: BLE001  (the other plan's numbers still count)
            report["errors"].append(f"{plan}: {type(e).__name__}: {e}")
            print(f"FAILED {plan}: {type(e).__name__}: {e}", flush=True)
        pipe = batch = None
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
        save()
    summary = {}
    for plan, e in report["plans"].items():
        if e["steps"]:
            summary[plan] = {k: min(s["seconds"][k] for s in e["steps"]) for k in e["steps"][0]["seconds"]}
    report["summary_min_seconds"] = summary
    save()
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
