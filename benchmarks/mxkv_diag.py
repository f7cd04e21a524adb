"""Where LEAN_CHECKED (mxfp4 checked fold) differs from the exact kernel (issue 15; check `mxkvdiag`, < 60 s).

The H200 runs `_1203a` / `_1203b` failed bit-identity in the 'window' mode of
tests/kernels/test_paged_attention_gluon_checked.py (in-window extreme scale bytes on ~2% of scale bytes), at different
groups each run. This splits the corruption by side (K only / V only / both) and by end (low bytes LO..LO+11 / high
bytes 123..134), several seeds each, and reports for each split how many outputs differ, in how many (sequence, head)
items, the largest absolute and relative difference, and the magnitude of the exact outputs where they differ - so
the next change knows which side and which end break the fold's exactness argument.
Usage: python benchmarks/mxkv_diag.py --out OUT.json (one H200, Triton 3.6).
"""

from __future__ import annotations

import argparse
import json
import time

import torch


def _corrupt(cache, end, gen, lo):
    """~2% of `cache`'s scale bytes (stale slots too) set to in-window extremes of one end: 'low' LO..LO+11, 'high'
    123..134 (test_paged_attention_gluon_checked._corrupt's 'window' mode, one end at a time)."""
    flat = cache.scales.view(-1)
    idx = torch.randint(0, flat.numel(), (flat.numel() // 50, ), generator=gen)
    a, b = {"low": (lo, lo + 12), "high": (123, 135)}[end]
    flat[idx.to(flat.device)] = torch.randint(a, b, (len(idx), ), generator=gen).to(torch.uint8).to(flat.device)


def run(seeds: int) -> dict:
    from tests.kernels.test_paged_attention_gluon import _decode_attention_tests
    from tests.kernels.test_paged_attention_gluon_checked import CASES
    from trace_rl.kernels.paged_attention_gluon import GluonAttentionConfig, decode_attention_gluon
    from trace_rl.kernels.paged_attention_gluon_kv import MX_CHK_LO_BYTE

    t = _decode_attention_tests()
    lens = [1, 600, 133, 0, 1024, 3000, 255, 384, 256, 129, 2944]
    rows = []
    for case in ("g8-lean", "g16-default", "g1-lean", "g4-persistent-lean"):
        group, fields = CASES[case]
        hkv = 8 if group < 16 else 2
        for side in ("k", "v", "kv"):
            for end in ("low", "high"):
                row = {"case": case, "side": side, "end": end, "seeds": seeds, "diff_elems": 0, "diff_items": 0,
                       "max_abs": 0.0, "max_rel": 0.0, "exact_abs_at_diff_max": 0.0, "exact_abs_at_diff_min": None,
                       "nonfinite_mismatch": 0}
                for s in range(seeds):
                    gen = torch.Generator().manual_seed(1000 * s + 7)
                    q, k, v, bt, sl = t._setup("mxfp4", lens, hkv, group, 128, 64, "cuda", gen)
                    for name in side:
                        _corrupt(k if name == "k" else v, end, gen, MX_CHK_LO_BYTE)
                    args = (q.cuda(), k, v, bt.cuda(), sl.cuda(), 128 ** -0.5)
                    exact = decode_attention_gluon(*args, config=GluonAttentionConfig(**fields))
                    checked = decode_attention_gluon(*args, config=GluonAttentionConfig(mx_checked=True, **fields))
                    # bits, as the test compares them (a -0 / +0 or NaN-payload difference fails it too)
                    bad = exact.view(torch.int16) != checked.view(torch.int16)
                    exact, checked = exact.float(), checked.float()
                    if not bad.any():
                        continue
                    row["nonfinite_mismatch"] += int((bad & (~exact.isfinite() | ~checked.isfinite())).sum())
                    fin = bad & exact.isfinite() & checked.isfinite()
                    row["diff_elems"] += int(bad.sum())
                    row["diff_items"] += int(bad.any(-1).sum())         # output [B, Hq, D]: (sequence, q head)
                    if fin.any():
                        d = (exact - checked).abs()[fin]
                        e = exact.abs()[fin]
                        row["max_abs"] = max(row["max_abs"], float(d.max()))
                        row["max_rel"] = max(row["max_rel"], float((d / e.clamp_min(1e-30)).max()))
                        row["exact_abs_at_diff_max"] = max(row["exact_abs_at_diff_max"], float(e.max()))
                        mn = float(e.min())
                        row["exact_abs_at_diff_min"] = mn if row["exact_abs_at_diff_min"] is None else min(
                            row["exact_abs_at_diff_min"], mn)
                rows.append(row)
                print(json.dumps(row), flush=True)
    return {"rows": rows, "lo": MX_CHK_LO_BYTE,
            "look_at": "rows with diff_elems > 0: which side (k / v / kv) and end (low = bytes LO..LO+11, high = "
                       "123..134) break bit identity; max_rel / exact_abs_at_diff_* say whether the differences are "
                       "last-bit roundings of ordinary values or underflow-sized ones"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--seeds", type=int, default=3)
    a = ap.parse_args()
    t0 = time.time()
    res = run(a.seeds)
    res["seconds"] = round(time.time() - t0, 1)
    json.dump(res, open(a.out, "w"), indent=1)


if __name__ == "__main__":
    main()
