"""One Gluon attention SASS-variant case on the GPU, in its own process (issue 15: the LEAN variants' illegal address,
benchmarks/attention_fix_h200.sh). Runs the base config, synchronises, runs the variant, synchronises, so a fault is
pinned to ONE launch (an illegal address is sticky: everything after it in the process fails too; run it with
CUDA_LAUNCH_BLOCKING=1). Problem: test_sass_variants_bit_identical_to_shipped_gpu's (ragged lengths with even and odd
full-tile counts, tails, an empty sequence; garbage block-table entries past each sequence), then the same with live
NaN K / V scale blocks. Writes OUT after every step, so a fault still leaves what ran before it.

    CUDA_LAUNCH_BLOCKING=1 python benchmarks/attention_fault_case.py --case nvfp4-g4-lean --out case.json
    python benchmarks/attention_fault_case.py --list
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

LEAN = dict(n_pad=8, unroll=2, col_max=True)  # n_pad=8 padded (pad_smem=True, the default since the fix)
NOPAD = dict(pad_smem=False)                 # n_pad=8's 8-wide q^T / P^T: the faulting build (before the fix)
# id: (format, group, GluonAttentionConfig fields of the variant; the base is the default config, with the variant's
# persistent / programs / mx_fold fields). "self" runs the default against itself: does the base fault on this problem?
# "-nopad": n_pad=8 as it faulted on 2026-12-02 (expected: failed_at "variant", an illegal address).
CASES = {
    "nvfp4-g4-self": ("nvfp4", 4, dict()),
    "nvfp4-g4-colmax": ("nvfp4", 4, dict(col_max=True)),
    "nvfp4-g4-n8": ("nvfp4", 4, dict(n_pad=8)),
    "nvfp4-g4-unroll2": ("nvfp4", 4, dict(unroll=2)),
    "nvfp4-g4-n8-unroll2": ("nvfp4", 4, dict(n_pad=8, unroll=2)),
    "nvfp4-g4-n8-colmax": ("nvfp4", 4, dict(n_pad=8, col_max=True)),
    "nvfp4-g4-unroll2-colmax": ("nvfp4", 4, dict(unroll=2, col_max=True)),
    "nvfp4-g4-lean": ("nvfp4", 4, LEAN),
    "mxfp4-g4-lean": ("mxfp4", 4, LEAN),
    "nvfp4-g4-n8-nopad": ("nvfp4", 4, dict(n_pad=8, **NOPAD)),
    "nvfp4-g4-lean-nopad": ("nvfp4", 4, dict(LEAN, **NOPAD)),
    "nvfp4-g8-lean": ("nvfp4", 8, LEAN),
    "nvfp4-g1-lean": ("nvfp4", 1, LEAN),
    "nvfp4-g16-colmax": ("nvfp4", 16, dict(col_max=True)),
    "nvfp4-g4-persistent-colmax": ("nvfp4", 4, dict(persistent=True, programs=5, col_max=True)),
    "nvfp4-g4-persistent-lean": ("nvfp4", 4, dict(persistent=True, programs=5, **LEAN)),
}
BASE_FIELDS = ("persistent", "programs", "mx_fold")


def _tests():
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "kernels",
                        "test_decode_attention.py")
    spec = importlib.util.spec_from_file_location("trace_rl_test_decode_attention", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def run(case: str, out_path: str) -> int:
    import torch

    from trace_rl.kernels.paged_attention_gluon import GluonAttentionConfig, decode_attention_gluon

    fmt, group, fields = CASES[case]
    res = {"case": case, "format": fmt, "group": group, "fields": fields, "steps": {},
           "launch_blocking": os.environ.get("CUDA_LAUNCH_BLOCKING") == "1"}

    def save():
        with open(out_path, "w") as f:
            json.dump(res, f, indent=1)

    def step(name, fn):
        t = time.time()
        try:
            value = fn()
            torch.cuda.synchronize()
            res["steps"][name] = {"ok": True, "s": round(time.time() - t, 2)}
            save()
            return value
        except Exception as e:   # noqa: BLE001
            res["steps"][name] = {"ok": False, "error": f"{type(e).__name__}: {e}"[:600],
                                  "trace": traceback.format_exc()[-1500:]}
            res["failed_at"] = name
            save()
            raise

    t = _tests()
    gen = torch.Generator().manual_seed(0)
    lens = [1, 600, 133, 0, 1024, 3000, 255, 384, 256, 129, 2944]
    hkv = 8 if group < 16 else 2
    try:
        q, k, v, bt, sl = step("setup", lambda: t._setup(fmt, lens, hkv, group, 128, 64, "cuda", gen))
        args = (q.cuda(), k, v, bt.cuda(), sl.cuda(), 128 ** -0.5)
        base = GluonAttentionConfig(**{n: x for n, x in fields.items() if n in BASE_FIELDS})
        variant = GluonAttentionConfig(**fields)
        shipped = step("base", lambda: decode_attention_gluon(*args, config=base))
        out = step("variant", lambda: decode_attention_gluon(*args, config=variant))
        res["bit_identical"] = bool(torch.equal(out.view(torch.int16), shipped.view(torch.int16)))
        ref = t._reference64(q, k, v, bt, sl, 128 ** -0.5)
        res["rel_err_vs_reference"] = max(t._rel_err(out[b : b + 1], ref[b : b + 1]) for b in range(len(lens))
                                          if lens[b])
        res["empty_zero"] = bool((out[3] == 0).all())
        nan = 145 if fmt == "nvfp4" else 255
        k.scales[bt[5, 7].item(), 1] = nan
        v.scales[bt[10, 45].item(), 0] = nan
        shipped = step("base_nan", lambda: decode_attention_gluon(*args, config=base))
        out = step("variant_nan", lambda: decode_attention_gluon(*args, config=variant))
        res["bit_identical_nan"] = bool(torch.equal(out.view(torch.int16), shipped.view(torch.int16)))
        res["passed"] = res["bit_identical"] and res["bit_identical_nan"] and res["rel_err_vs_reference"] < 1e-2 \
            and res["empty_zero"]
    except Exception:   # noqa: BLE001
        res["passed"] = False
    save()
    print(json.dumps({k: res.get(k) for k in ("case", "passed", "failed_at", "bit_identical", "bit_identical_nan",
                                               "rel_err_vs_reference")}))
    return 0 if res["passed"] else 1


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--case")
    ap.add_argument("--out")
    ap.add_argument("--list", action="store_true", help="print the case ids")
    a = ap.parse_args()
    if a.list:
        print(" ".join(CASES))
        return 0
    if a.case not in CASES:
        print(f"unknown case {a.case!r}; one of: {', '.join(CASES)}", file=sys.stderr)
        return 2
    return run(a.case, a.out or f"case_{a.case}.json")


if __name__ == "__main__":
    sys.exit(main())
