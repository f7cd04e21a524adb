"""Produce the embedded default policy (trace_rl/assets/default_policy): SFT a tiny char-level Qwen3-style
model on the arithmetic task to a modest accuracy, so RL has room to improve it.

    python scripts/train_default_policy.py [--steps 1500] [--out trace_rl/assets/default_policy]

Deterministic for a seed on CPU. Prints held-out greedy accuracy as it goes; stops at --steps.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from trace_rl.models.loading import save_pretrained
from trace_rl.models.presets import tiny_model
from trace_rl.tasks import ArithmeticTask

OUT = Path(__file__).resolve().parent.parent / "trace_rl" / "assets" / "default_policy"


def encode_batch(tok, problems, task):
    """tokens [B, T] (prompt + target, right-padded) and a loss mask over the target tokens."""
    rows, masks = [], []
    for p in problems:
        prompt, target = tok.encode(p.prompt), tok.encode(task.sft_target(p))
        rows.append(prompt + target)
        masks.append([0] * len(prompt) + [1] * len(target))
    width = max(map(len, rows))
    tokens = torch.full((len(rows), width), tok.pad_token_id, dtype=torch.long)
    mask = torch.zeros(len(rows), width, dtype=torch.bool)
    for i, (r, m) in enumerate(zip(rows, masks)):
        tokens[i, :len(r)] = torch.tensor(r)
        mask[i, :len(m)] = torch.tensor(m, dtype=torch.bool)
    return tokens, mask


@torch.no_grad()
def greedy_accuracy(model, tok, task, problems, max_new_tokens=6):
    correct = 0
    for p in problems:
        ids = tok.encode(p.prompt)
        for _ in range(max_new_tokens):
            nxt = int(model(torch.tensor([ids]))[0, -1].argmax())
            ids.append(nxt)
            if tok.decode([nxt]) == "\n" or nxt == tok.eos_token_id:
                break
        correct += task.score(p, tok.decode(ids[len(tok.encode(p.prompt)):])).correct
    return correct / len(problems)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-digits", type=int, default=3)
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    torch.manual_seed(args.seed)
    torch.set_num_threads(2)
    task = ArithmeticTask(ops=("add",), min_digits=1, max_digits=args.max_digits)
    model, tok = tiny_model("tiny", seed=args.seed)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=args.lr, total_steps=args.steps, pct_start=0.1)
    eval_problems = task.problems(200, args.seed, "eval")
    t0 = time.time()
    for step in range(1, args.steps + 1):
        tokens, mask = encode_batch(tok, task.problems(args.batch, args.seed * 7919 + step, "train"), task)
        logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1), reduction="none")
        loss = (loss * mask[:, 1:].reshape(-1)).sum() / mask[:, 1:].sum()
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if step % 100 == 0 or step == args.steps:
            model.eval()
            acc = greedy_accuracy(model, tok, task, eval_problems)
            model.train()
            print(f"step {step:5d}  loss {loss.item():.4f}  held-out greedy accuracy {acc:.3f}  "
                  f"({time.time() - t0:.0f} s)", flush=True)
    model.eval()
    # Shipped in bfloat16 (half the bytes); the trainer upcasts to its own dtype when it loads.
    save_pretrained(model.to(torch.bfloat16), tok, args.out)
    print(f"saved {args.out}")


if __name__ == "__main__":
    main()
