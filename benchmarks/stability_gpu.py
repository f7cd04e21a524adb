"""Stability study, part (b), in one device call: SFT a ~100M-parameter char-level Qwen3-style decoder from
scratch on worked long multiplication (answers of ~560-1900 characters), then measure the rollout/trainer
drift of several precision plans over long sampled responses, overall and by token position.

    python benchmarks/stability_gpu.py --out $OUT              # H200: ~100 s SFT + the drift audits
    python benchmarks/stability_gpu.py --smoke --out /tmp/s    # CPU: the same code path, tiny sizes

Plans are measured in priority order until `--deadline` seconds have passed since start (the rest are
recorded as skipped); stability_gpu.json is rewritten after each plan, so a run cut short keeps what it got.
Writes stability_gpu.json (SFT curve, per-plan metrics, by-position bins, accuracy at T=1, engine paths,
timings) and drift_gpu.png (mean |log ρ| and k3 by position, pow2 and linear bins).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from trace_rl.audit.drift import DriftAudit, PlanDrift, json_safe  # noqa: E402
from trace_rl.audit.inputs import encode_prompts  # noqa: E402
from trace_rl.audit.plots import plot_drift_by_position  # noqa: E402
from trace_rl.correction.metrics import drift_metrics, mismatch_by_position, power_of_two_edges  # noqa: E402
from trace_rl.engine.base import SamplingParams  # noqa: E402
from trace_rl.models.config import ModelConfig  # noqa: E402
from trace_rl.models.decoder import build  # noqa: E402
from trace_rl.models.presets import char_tokenizer_for  # noqa: E402
from trace_rl.plan import PrecisionPlan  # noqa: E402
from trace_rl.tasks import ArithmeticTask  # noqa: E402
from trace_rl.tasks.sft import sft_autocast, sft_batch, sft_step  # noqa: E402

# Priority order: what the study needs first (bf16 floor, full FP4, FP8), then attributions and the fix.
PLANS = {
    "bf16": PrecisionPlan(),
    "fp4": PrecisionPlan.preset("fp4"),
    "fp8": PrecisionPlan.preset("fp8"),
    "kv-nvfp4": PrecisionPlan(kv_cache="nvfp4"),
    "w4a16": PrecisionPlan.preset("w4a16"),
    "fp4-aligned": PrecisionPlan.preset("fp4-aligned"),
    "kv-fp8": PrecisionPlan(kv_cache="fp8_e4m3"),
}


def encode_batch(task, tok, problems, device):
    """prompt + worked solution + EOS, right-padded; the loss mask covers the solution and EOS."""
    tokens, mask = sft_batch(task, tok, problems, eos=True)
    return tokens.to(device, non_blocking=True), mask.to(device, non_blocking=True)


def sft(model, task, tok, args, device, log) -> list[dict]:
    """Time-bounded SFT: AdamW, warm-up then cosine decay over the *wall-clock* budget."""
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1,
                            fused=device.type == "cuda")
    autocast = sft_autocast(device)
    curve, step, t0 = [], 0, time.perf_counter()
    model.train()
    while (elapsed := time.perf_counter() - t0) < args.sft_seconds:
        frac = elapsed / args.sft_seconds
        warm = 0.05
        cosine = 0.1 + 0.45 * (1 + math.cos(math.pi * (frac - warm) / (1 - warm)))
        lr = args.lr * (frac / warm if frac < warm else cosine)
        for group in opt.param_groups:
            group["lr"] = lr
        step += 1
        tokens, mask = encode_batch(task, tok, task.problems(args.batch, args.seed * 7919 + step, "train"), device)
        loss, _ = sft_step(model, opt, tokens, mask, autocast)
        if step % 25 == 0 or step == 1:
            curve.append({"step": step, "seconds": time.perf_counter() - t0, "loss": loss.item(), "lr": lr,
                          "tokens": int(mask.sum())})
            log(f"sft step {step}: loss {curve[-1]['loss']:.4f} ({curve[-1]['seconds']:.0f}s)")
    model.eval()
    return curve


def bins_of(raw, edges):
    b = mismatch_by_position(raw.lp_rollout, raw.lp_trainer, raw.mask, edges)
    return {"edges": b.edges, "count": b.count, "abs_log_ratio": b.abs_log_ratio, "k1": b.k1, "k3": b.k3}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "runs/stability_gpu")))
    ap.add_argument("--smoke", action="store_true", help="tiny sizes (CPU check of the whole path)")
    ap.add_argument("--layers", type=int, default=14)
    ap.add_argument("--hidden", type=int, default=768)
    ap.add_argument("--mlp", type=int, default=2560)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--min-digits", type=int, default=3)
    ap.add_argument("--max-digits", type=int, default=5)
    ap.add_argument("--sft-seconds", type=float, default=100.0)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--samples", type=int, default=1)
    ap.add_argument("--max-new-tokens", type=int, default=2048)
    ap.add_argument("--linear-bin", type=int, default=128, help="width of the linear position bins")
    ap.add_argument("--plans", default=",".join(PLANS))
    ap.add_argument("--deadline", type=float, default=230.0, help="start no plan after this many seconds")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--replot", type=Path, help="only redraw the PNGs from this stability_gpu.json")
    args = ap.parse_args()
    if args.replot:
        replot(args.replot, args.out)
        return
    if args.smoke:
        args.layers, args.hidden, args.mlp, args.heads, args.kv_heads = 2, 64, 128, 2, 1
        args.sft_seconds, args.batch, args.prompts, args.max_new_tokens, args.linear_bin = 4, 4, 2, 48, 16
        args.min_digits, args.max_digits = 1, 2
    t_start = time.perf_counter()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    args.out.mkdir(parents=True, exist_ok=True)
    log_file = (args.out / "stability_gpu.log").open("w")

    def log(msg):
        line = f"[{time.perf_counter() - t_start:6.1f}s] {msg}"
        print(line, flush=True)
        log_file.write(line + "\n")
        log_file.flush()

    torch.manual_seed(args.seed)
    config = ModelConfig(family="qwen3", vocab_size=128, hidden_size=args.hidden, intermediate_size=args.mlp,
                         num_layers=args.layers, num_heads=args.heads, num_kv_heads=args.kv_heads,
                         head_dim=args.hidden // args.heads, max_position_embeddings=4096, tie_word_embeddings=True,
                         qk_norm=True, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    tok = char_tokenizer_for(config)
    model = build(config, device=device, dtype=torch.float32).init_random(
        generator=torch.Generator(device=device).manual_seed(args.seed))
    task = ArithmeticTask(show_work=True, ops=("mul",), min_digits=args.min_digits, max_digits=args.max_digits)
    record = {"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
              "torch": torch.__version__, "args": {k: str(v) for k, v in vars(args).items()},
              "params_m": config.num_params / 1e6, "task": task.config.to_dict(), "plans": {}}
    out_json = args.out / "stability_gpu.json"
    log(f"model {config.num_params / 1e6:.1f}M params on {record['device']}")
    record["sft"] = sft(model, task, tok, args, device, log)

    problems = task.problems(args.prompts, args.seed, "eval")
    prompts = encode_prompts([p.prompt for p in problems], tok)
    sampling = SamplingParams(n=args.samples, temperature=1.0, max_new_tokens=args.max_new_tokens,
                              stop_token_ids=(tok.eos_token_id,), seed=args.seed)
    audit = DriftAudit(model, tok, prompts, sampling, device, max_batch=args.prompts * args.samples,
                       micro_batch_size=16)
    pow2 = power_of_two_edges(args.max_new_tokens)
    linear = list(range(0, args.max_new_tokens + args.linear_bin, args.linear_bin))
    for name in [n.strip() for n in args.plans.split(",")]:
        plan = PLANS[name]
        if time.perf_counter() - t_start > args.deadline:
            record["plans"][name] = {"skipped": f"deadline of {args.deadline:.0f}s passed"}
            log(f"{name}: skipped (deadline)")
            continue
        try:
            raw = audit.sample(plan)
        except Exception as err:   # one plan failing on this machine must not lose the others' results
            record["plans"][name] = {"error": f"{type(err).__name__}: {err}"}
            log(f"{name}: FAILED {type(err).__name__}: {err}")
            out_json.write_text(json.dumps(json_safe(record), indent=1, default=str))
            continue
        metrics = drift_metrics(raw.lp_rollout, raw.lp_trainer, raw.mask)
        lengths = raw.mask.sum(-1)
        texts = [tok.decode(row[m].tolist()) for row, m in zip(raw.tokens, raw.mask)]
        scores = [task.score(problems[i // args.samples], t) for i, t in enumerate(texts)]
        record["plans"][name] = {
            "label": plan.label, "trainer": plan.trainer, "plan": plan.to_dict(), "metrics": metrics,
            "by_position_pow2": bins_of(raw, pow2), "by_position_linear": bins_of(raw, linear),
            "tokens": int(raw.mask.sum()), "mean_length": lengths.float().mean().item(),
            "max_length": int(lengths.max()), "accuracy_t1": sum(s.correct for s in scores) / len(scores),
            "format_ok_t1": sum(s.format_ok for s in scores) / len(scores),
            "rollout_seconds": raw.rollout_seconds, "rescore_seconds": raw.rescore_seconds,
            "rollout_tokens_per_s_incl_warmup": int(raw.mask.sum()) / raw.rollout_seconds, "engine": raw.engine,
            "sample_text": texts[0][:400]}
        log(f"{name} ({plan.label}, trainer {plan.trainer}): {int(raw.mask.sum())} tokens, mean length "
            f"{lengths.float().mean():.0f}, acc@T1 {record['plans'][name]['accuracy_t1']:.2f}, k3 "
            f"{metrics['mismatch_k3']:.3g}, |log rho| {metrics['abs_log_ratio_mean']:.3g}, rollout "
            f"{raw.rollout_seconds:.1f}s, rescore {raw.rescore_seconds:.1f}s")
        out_json.write_text(json.dumps(json_safe(record), indent=1, default=str))
    model.apply_plan(None)
    record["total_seconds"] = time.perf_counter() - t_start
    out_json.write_text(json.dumps(json_safe(record), indent=1, default=str))
    replot(out_json, args.out)
    log(f"wrote {out_json}")


def replot(json_path: Path, out: Path) -> None:
    """drift_gpu.png (pow2 bins) and drift_gpu_linear.png (equal-width bins) from stability_gpu.json."""
    record = json.loads(Path(json_path).read_text())
    measured = {n: p for n, p in record["plans"].items() if "metrics" in p}
    if not measured:
        return
    params, sft_s = record["params_m"], float(record["args"]["sft_seconds"])
    for key, png, title in (("by_position_pow2", "drift_gpu.png", "drift by position (pow2 bins)"),
                            ("by_position_linear", "drift_gpu_linear.png", "the same samples in equal bins")):
        results = [PlanDrift(name=n, plan=PrecisionPlan.parse(p["plan"]), metrics=p["metrics"],
                             by_position=_as_position(p[key]), rows=0, tokens=p["tokens"], longest=p["max_length"],
                             rollout_seconds=p["rollout_seconds"], rescore_seconds=p["rescore_seconds"])
                   for n, p in measured.items()]
        plot_drift_by_position(results, Path(out) / png, f"{params:.1f}M char decoder, SFT {sft_s:.0f}s on worked "
                                                         f"multiplication, T=1 samples: {title}")


def _as_position(d):
    from trace_rl.correction.metrics import PositionMismatch

    def nan(values):   # JSON holds an empty bin's NaN as null
        return [math.nan if v is None else v for v in values]

    return PositionMismatch(edges=d["edges"], count=d["count"], abs_log_ratio=nan(d["abs_log_ratio"]), k1=nan(d["k1"]),
                            k3=nan(d["k3"]))


if __name__ == "__main__":
    main()
