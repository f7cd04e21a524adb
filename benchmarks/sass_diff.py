"""Compile kernels for sm_90 at two git revisions and diff their SASS: the check that a refactor of `@triton.jit`
code (a helper factored out, code moved between files) leaves the compiled kernels as they were. No GPU needed
(trace_rl/kernels/sass_gate.py: Triton's wheel carries ptxas and cuobjdump).

    python benchmarks/sass_diff.py main                      # the gate's cases: main vs the working tree
    python benchmarks/sass_diff.py abdfe10~1 abdfe10 --only rms_norm
    python benchmarks/sass_diff.py main --cases benchmarks/sass_cases_quantize_tail.py --triton /work/triton36

A revision is checked out with `git archive` into a temporary directory (WORKTREE: this checkout as it is), and
each side compiles in its own subprocess with that tree and `--triton` (a directory put first on PYTHONPATH, e.g.
/work/triton36: the H200's Triton 3.6) on PYTHONPATH; the two sides run in parallel. The cases are the gate's
(`sass_gate.gate_cases`, filtered by --only), or those of a `--cases` file: a Python file (read from this checkout,
not from the revision) defining `cases()` -> list of `sass_gate.GateCase`, built from the revision's modules (so it
must import only names that exist at both revisions).

Per case it prints: identical (the cuobjdump SASS text byte for byte), or what differs: instruction count,
registers, the opcodes whose counts changed, and the number of differing lines (the full diff goes to --out).
Exit status 0 when every case compiled on both sides and is identical.
"""

from __future__ import annotations

import argparse
import collections
import difflib
import json
import os
import re
import runpy
import subprocess
import sys
import tarfile
import tempfile
from concurrent.futures import ThreadPoolExecutor

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKTREE = "WORKTREE"


def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("_")


def _checkout(rev: str, side: str, tmp: str) -> str:
    """A directory holding `rev`'s tree (this checkout itself for WORKTREE)."""
    if rev == WORKTREE:
        return ROOT
    dest = os.path.join(tmp, side)
    os.makedirs(dest)
    archive = subprocess.run(["git", "-C", ROOT, "archive", rev], capture_output=True, check=True).stdout
    with tempfile.TemporaryFile() as f:
        f.write(archive)
        f.seek(0)
        with tarfile.open(fileobj=f) as tar:
            tar.extractall(dest, filter="data")
    return dest


def _dump(out_dir: str, cases_file: str | None, only: list[str]) -> int:
    """(In the subprocess, with the revision on sys.path.) Compile every case; write <slug>.sass and index.json."""
    from trace_rl.kernels import sass_gate

    cases = runpy.run_path(cases_file)["cases"]() if cases_file else sass_gate.gate_cases(None)
    cases = [c for c in cases if not only or any(o in c.name for o in only)]
    index = []
    for case in cases:
        entry = {"name": case.name, "file": _slug(case.name) + ".sass"}
        try:
            sass, usage = sass_gate.compile_sass(case)
            with open(os.path.join(out_dir, entry["file"]), "w") as f:
                f.write(sass)
            entry["usage"] = usage
        except Exception as e:  # reported per case: one that fails to compile must not hide the others
            entry["error"] = f"{type(e).__name__}: {str(e)[-2000:]}"
        index.append(entry)
        print(f"compiled {case.name}" + (f"  ERROR {entry['error'][:200]}" if "error" in entry else ""), flush=True)
    import triton

    with open(os.path.join(out_dir, "index.json"), "w") as f:
        json.dump({"triton": triton.__version__, "cases": index}, f, indent=1)
    return 0


def _compile_side(rev: str, side: str, tmp: str, args) -> tuple[str, str]:
    src = _checkout(rev, side, tmp)
    out = os.path.join(args.out, side)
    os.makedirs(out, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (args.triton, src) if p)
    cmd = [sys.executable, os.path.abspath(__file__), "--dump", out]
    if args.cases:
        cmd += ["--cases", os.path.abspath(args.cases)]
    if args.only:
        cmd += ["--only", *args.only]
    proc = subprocess.run(cmd, env=env, cwd=src, capture_output=True, text=True)
    if proc.returncode or not os.path.exists(os.path.join(out, "index.json")):
        raise RuntimeError(f"sass_diff: compiling at {rev} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return out, proc.stdout


_INSTR = re.compile(r"\s+/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
_OPCODE = re.compile(r"^(?:@!?U?P\w+\s+)?([A-Z0-9_.]+)")


def _instructions(sass: str) -> list[str]:
    return [m.group(2) for m in map(_INSTR.match, sass.splitlines()) if m]


def _compare(name: str, before: str, after: str, out_dir: str) -> dict:
    """What differs between two SASS texts of one case."""
    if before == after:
        return {"name": name, "identical": True, "instructions": len(_instructions(before))}
    ib, ia = _instructions(before), _instructions(after)
    ob = collections.Counter(_OPCODE.match(t).group(1) for t in ib if _OPCODE.match(t))
    oa = collections.Counter(_OPCODE.match(t).group(1) for t in ia if _OPCODE.match(t))
    changed = {op: (ob[op], oa[op]) for op in sorted(set(ob) | set(oa)) if ob[op] != oa[op]}
    diff = list(difflib.unified_diff(ib, ia, "before", "after", lineterm="", n=2))
    with open(os.path.join(out_dir, _slug(name) + ".diff"), "w") as f:
        f.write("\n".join(diff) + "\n")
    return {"name": name, "identical": False, "instructions": (len(ib), len(ia)), "opcodes_changed": changed,
            "same_instruction_text": ib == ia,
            "differing_lines": sum(1 for d in diff if d[:1] in "+-" and not d.startswith(("+++", "---")))}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("before", nargs="?", help="git revision (e.g. main, HEAD~1)")
    ap.add_argument("after", nargs="?", default=WORKTREE, help=f"git revision, or {WORKTREE} (default)")
    ap.add_argument("--cases", help="a Python file defining cases() -> list of GateCase (default: the gate's)")
    ap.add_argument("--only", nargs="*", default=[], help="substrings of case names")
    ap.add_argument("--triton", default=os.environ.get("TRACE_RL_GATE_TRITON", ""),
                    help="a directory holding the Triton to compile with (first on PYTHONPATH)")
    ap.add_argument("--out", default="", help="where the SASS, diffs and report.json go (default: a temp dir)")
    ap.add_argument("--dump", help=argparse.SUPPRESS)          # the per-revision subprocess
    args = ap.parse_args(argv)
    if args.dump:
        sys.path.insert(0, os.getcwd())
        return _dump(args.dump, args.cases, args.only)
    if not args.before:
        ap.error("name the revision to compare against (e.g. main)")
    args.out = args.out or tempfile.mkdtemp(prefix="sass_diff_")
    os.makedirs(args.out, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp, ThreadPoolExecutor(2) as pool:
        (dir_b, log_b), (dir_a, log_a) = pool.map(lambda side: _compile_side(*side, tmp, args),
                                                ((args.before, "before"), (args.after, "after")))
    idx_b = json.load(open(os.path.join(dir_b, "index.json")))
    idx_a = json.load(open(os.path.join(dir_a, "index.json")))
    after_cases = {c["name"]: c for c in idx_a["cases"]}
    report, status = [], 0
    print(f"SASS (sm_90, Triton {idx_b['triton']} / {idx_a['triton']}): {args.before} -> {args.after}")
    for cb in idx_b["cases"]:
        ca = after_cases.pop(cb["name"], None)
        if ca is None or "error" in cb or "error" in ca:
            why = "missing after" if ca is None else (cb.get("error") or ca.get("error"))
            report.append({"name": cb["name"], "error": why})
            print(f"ERROR     {cb['name']}: {why[:300]}")
            status = 1
            continue
        r = _compare(cb["name"], open(os.path.join(dir_b, cb["file"])).read(),
                     open(os.path.join(dir_a, ca["file"])).read(), args.out)
        r["registers"] = (cb["usage"].get("REG"), ca["usage"].get("REG"))
        report.append(r)
        if r["identical"]:
            print(f"identical {cb['name']:<56} {r['instructions']:5d} instr {r['registers'][0]:3d} regs")
        else:
            status = 1
            print(f"DIFFERS   {cb['name']:<56} {r['instructions'][0]} -> {r['instructions'][1]} instr, regs "
                  f"{r['registers'][0]} -> {r['registers'][1]}, {r['differing_lines']} lines differ, opcodes "
                  f"changed: {r['opcodes_changed'] or 'none'}")
    for name in after_cases:
        report.append({"name": name, "error": "new after (not compiled before)"})
        print(f"ERROR     {name}: only after")
        status = 1
    with open(os.path.join(args.out, "report.json"), "w") as f:
        json.dump(report, f, indent=1)
    same = sum(1 for r in report if r.get("identical"))
    print(f"{same} of {len(report)} cases byte-identical; SASS, diffs and report.json in {args.out}")
    return status


if __name__ == "__main__":
    sys.exit(main())
