"""Produce the embedded default policy (trace_rl/assets/default_policy): SFT a tiny char-level Qwen3-style
model on the arithmetic task to a modest accuracy, so RL has room to improve it.

    python scripts/train_default_policy.py [--steps 1500] [--device cpu|cuda] [--save-at 400,800]

Deterministic for a seed on one device. Prints held-out greedy accuracy as it goes; with --save-at it also
saves snapshots (<out>-step<N>) so a snapshot of the wanted accuracy can be shipped. The shipped policy
was made on the H200 (device tool) with the command in docs/pipelines.md ("The embedded default").
"""

from __future__ import annotations

import argparse
import copy
import json
import time
from pathlib import Path

import torch

from trace_rl.engine.base import SamplingParams
from trace_rl.models.loading import save_pretrained
from trace_rl.models.presets import tiny_model
from trace_rl.tasks import ArithmeticTask
from trace_rl.tasks.sft import sft_batch, sft_step

OUT = Path(__file__).resolve().parent.parent / "trace_rl" / "assets" / "default_policy"


def encode_batch(tok, problems, task, device):
    """tokens [B, T] (prompt + target, right-padded; no EOS, as the shipped policy was trained) and a loss
    mask over the target tokens."""
    tokens, mask = sft_batch(task, tok, problems, eos=False)
    return tokens.to(device), mask.to(device)


@torch.no_grad()
def greedy_accuracy(model, tok, task, problems, device, max_new_tokens=6):
    """Greedy decoding by full re-forward, prompts of equal length batched together."""
    prompts = [tok.encode(p.prompt) for p in problems]
    # no attention mask in a plain forward: batch prompts of equal length together
    outs = [""] * len(problems)
    by_len: dict[int, list[int]] = {}
    for i, p in enumerate(prompts):
        by_len.setdefault(len(p), []).append(i)
    newline = tok.encode("\n")[0]
    for _, idx in sorted(by_len.items()):
        ids = torch.tensor([prompts[i] for i in idx], device=device)
        done = torch.zeros(len(idx), dtype=torch.bool, device=device)
        gen = []
        for _ in range(max_new_tokens):
            nxt = model(ids)[:, -1].argmax(-1)
            gen.append(nxt)
            ids = torch.cat([ids, nxt[:, None]], 1)
            done |= (nxt == newline) | (nxt == tok.eos_token_id)
            if bool(done.all()):
                break
        gen = torch.stack(gen, 1).tolist()
        for row, i in zip(gen, idx):
            outs[i] = tok.decode(row)
    return sum(task.score(p, o).correct for p, o in zip(problems, outs)) / len(problems)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-digits", type=int, default=3)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--eval-every", type=int, default=100)
    ap.add_argument("--save-at", default="", help="comma-separated steps at which to save snapshots")
    ap.add_argument("--stop-after", type=int, default=None,
                    help="stop (and save) after this many steps, keeping the schedule of --steps")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    torch.manual_seed(args.seed)
    if args.device == "cpu":
        torch.set_num_threads(2)
    device = torch.device(args.device)
    save_at = {int(s) for s in args.save_at.split(",") if s}
    task = ArithmeticTask(ops=("add",), min_digits=1, max_digits=args.max_digits)
    model, tok = tiny_model("tiny", seed=args.seed, device=device)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=args.lr, total_steps=args.steps, pct_start=0.1)
    eval_problems = task.problems(500, args.seed, "eval")
    t0, log = time.time(), []
    last = min(args.steps, args.stop_after or args.steps)
    for step in range(1, last + 1):
        tokens, mask = encode_batch(tok, task.problems(args.batch, args.seed * 7919 + step, "train"), task, device)
        loss, _ = sft_step(model, opt, tokens, mask)
        sched.step()
        if step % args.eval_every == 0 or step == last or step in save_at:
            model.eval()
            acc = greedy_accuracy(model, tok, task, eval_problems, device)
            model.train()
            log.append({"step": step, "loss": loss.item(), "accuracy": acc, "seconds": time.time() - t0})
            print(f"step {step:5d}  loss {loss.item():.4f}  held-out greedy accuracy {acc:.3f}  "
                  f"({time.time() - t0:.0f} s)", flush=True)
            if step in save_at:
                snap = args.out.with_name(f"{args.out.name}-step{step}")
                save_pretrained(copy.deepcopy(model).to(torch.bfloat16).cpu().eval(), tok, snap)
    model.eval()
    # Shipped in bfloat16 (half the bytes); the trainer upcasts to its own dtype when it loads.
    # generation_config.json: greedy, stopping at <eos> or the newline the task ends answers with
    answer = SamplingParams(temperature=0.0, max_new_tokens=6, stop_token_ids=(tok.eos_token_id, tok.encode("\n")[0]))
    save_pretrained(model.to(torch.bfloat16).cpu(), tok, args.out, sampling=answer)
    (args.out.parent / f"{args.out.name}-log.json").write_text(json.dumps(log, indent=1))
    print(f"saved {args.out}")


if __name__ == "__main__":
    main()
