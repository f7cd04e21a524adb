"""`trace-rl` command line (also `python -m trace_rl`)."""

from __future__ import annotations

import argparse
import json
import sys


def _cmd_formats(args: argparse.Namespace) -> int:
    from trace_rl.formats.report import error_table, format_table

    results = error_table(args.rows, args.cols, args.seed)
    print(f"Quantization error of a {args.rows}x{args.cols} weight-like tensor (Gaussian, 8 outlier channels):")
    print(format_table(results))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
        print(f"wrote {args.json}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="trace-rl",
        description="RL for language models with low-precision (FP4/FP8) rollout and drift correction.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("formats", help="quantize a model-sized tensor in every format and print the error table")
    p.add_argument("--rows", type=int, default=4096, help="tensor rows (default 4096)")
    p.add_argument("--cols", type=int, default=4096, help="tensor columns (default 4096)")
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    p.add_argument("--json", help="also write the results to this JSON file")
    p.set_defaults(func=_cmd_formats)

    p = sub.add_parser("run", help="run an RL pipeline (no CONFIG: the embedded default)")
    p.add_argument("config", nargs="?", help="pipeline config file (.yaml/.toml); default: the embedded default")
    p.set_defaults(func=_cmd_formats, rows=4096, cols=4096, seed=0, json=None)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
