"""One MoE layer's experts per plan (`moe_chain`) and the small dense nvfp4 W4A16 sweep (`sweep_dense`): the
`--chain` and `--dense` parts of benchmarks/kernels_moe.py."""

from __future__ import annotations

import time

import torch
from kernels_moe_shapes import DENSE_M, DENSE_SHAPES, DEV, MOE, dense_configs, rel_err, time_us


def sweep_dense(read_bw: float, log, deadline: float, sweep: bool = True) -> list:
    import torch.nn.functional as F

    from trace_rl.backends import PackedWeight
    from trace_rl.kernels import quantize
    from trace_rl.kernels.fp4_gemm import default_config
    from trace_rl.kernels.linear import fp4_linear, hopper_weight

    rows = []
    for K, N in DENSE_SHAPES:
        copies = 8
        w_bf16 = [torch.randn(N, K, device=DEV, dtype=torch.bfloat16) * 0.02 for _ in range(copies)]
        packed = {f: [PackedWeight(f, N, K, q=quantize(w, f)) for w in w_bf16] for f in ("nvfp4", "mxfp4")}
        nbytes = {f: [hopper_weight(p) for p in packed[f]][0].nbytes for f in packed}
        ref_w = packed["nvfp4"][0].dequantized().float()
        for M in DENSE_M:
            if time.time() > deadline:
                log({"skipped": f"dense {K}x{N} M={M}: out of time"})
                continue
            x = torch.randn(M, K, device=DEV, dtype=torch.bfloat16)
            ref = x.float() @ ref_w.T
            row = {"K": K, "N": N, "M": M}
            row["cublas_bf16_us"] = time_us([lambda w=w, x=x: F.linear(x, w) for w in w_bf16])
            cands = [default_config(M, N, K)] + (dense_configs(M) if sweep else [])
            res = []
            for i, c in enumerate(cands):
                entry = {"cfg": [c.block_m, c.block_n, c.block_k, c.split_k, c.num_warps, c.num_stages],
                         "default": i == 0}
                try:
                    err = rel_err(fp4_linear(x, packed["nvfp4"][0], "bf16", None, config=c), ref)
                    if not err < 1e-2:
                        entry["error"] = f"rel err {err:.3g}"
                    else:
                        us = time_us([lambda p=p, c=c, x=x: fp4_linear(x, p, "bf16", None, config=c)
                                       for p in packed["nvfp4"]], reps=7)
                        entry.update(us=round(us, 2), x_cublas=round(row["cublas_bf16_us"] / us, 3),
                                     bw=round(nbytes["nvfp4"] / (us * 1e-6) / read_bw, 3))
                except Exception as e:   # noqa: BLE001
                    entry["error"] = repr(e)[:300]
                res.append(entry)
            row["nvfp4_w4a16"] = res
            ok = [r for r in res if "us" in r]
            if ok:
                best = min(ok, key=lambda r: r["us"])
                row["nvfp4_best"] = best
                bm, bn, bk, s, nw, ns = best["cfg"]
                from trace_rl.kernels.fp4_gemm import GemmConfig

                c = GemmConfig(bm, bn, bk, s, nw, ns)
                try:
                    us = time_us([lambda p=p, c=c, x=x: fp4_linear(x, p, "bf16", None, config=c)
                                   for p in packed["mxfp4"]])
                    row["mxfp4_best_cfg_us"] = us
                    row["mxfp4_best_cfg_x_cublas"] = row["cublas_bf16_us"] / us
                except Exception as e:   # noqa: BLE001
                    row["mxfp4_error"] = repr(e)[:300]
            log(row)
            rows.append(row)
        del w_bf16, packed, ref_w
        torch.cuda.empty_cache()
    return rows


def moe_chain(batches: list[int], log, deadline: float) -> list:
    """One MoE layer's experts (permute gather, gate+up, SiLU * up, down; router and un-permute excluded) in a
    CUDA graph, per plan: bf16 (`torch._grouped_mm`), W4A16 (torch SiLU * up, or the swiglu kernel), W4A4 as the
    rollout ran it (gather, the grouped linear with its quantize launch over the k-times-repeated rows, torch
    SiLU * up) and W4A4 with the producers handed to `fp4_grouped_linear` (`src_rows`: the tokens quantized
    once, then gathered; `silu_mul`: SwiGLU fused into the quantize launch)."""
    import torch.nn.functional as F

    from trace_rl.backends.fp4 import prepare_expert_weights
    from trace_rl.kernels.linear import fp4_grouped_linear, hopper_weight
    from trace_rl.kernels.swiglu import silu_mul
    from trace_rl.models.grouped import gather_rows, permute

    E, k, H, I = MOE["experts"], MOE["top_k"], MOE["hidden"], MOE["inter"]
    gen = torch.Generator(device=DEV).manual_seed(1)
    w_gu = torch.randn(E, 2 * I, H, device=DEV, dtype=torch.bfloat16, generator=gen) * 0.02
    w_d = torch.randn(E, H, I, device=DEV, dtype=torch.bfloat16, generator=gen) * 0.02
    rows = []
    for B in batches:
        if time.time() > deadline:
            log({"skipped": f"chain B={B}: out of time"})
            continue
        x = torch.randn(B, H, device=DEV, dtype=torch.bfloat16, generator=gen)
        ids = torch.randn(B, E, device=DEV, generator=gen).topk(k, dim=1).indices
        perm = permute(ids, E)
        off = torch.cat([perm.ends.new_zeros(1), perm.ends])
        row = {"B": B, "rows": B * k}

        def bf16(x=x, perm=perm):
            g, u = torch._grouped_mm(gather_rows(x, perm), w_gu.transpose(1, 2), offs=perm.ends).chunk(2, dim=-1)
            return torch._grouped_mm(F.silu(g) * u, w_d.transpose(1, 2), offs=perm.ends)
        plans = {"bf16_grouped_mm": bf16}
        for fmt in ("nvfp4", "mxfp4"):
            gu, dn = prepare_expert_weights(w_gu, fmt), prepare_expert_weights(w_d, fmt)
            hopper_weight(gu), hopper_weight(dn)                     # derive the layouts now

            def a16(x=x, perm=perm, off=off, gu=gu, dn=dn):
                g, u = fp4_grouped_linear(gather_rows(x, perm), off, gu).chunk(2, dim=-1)
                return fp4_grouped_linear(F.silu(g) * u, off, dn)

            def a16_swiglu(x=x, perm=perm, off=off, gu=gu, dn=dn):
                return fp4_grouped_linear(silu_mul(fp4_grouped_linear(gather_rows(x, perm), off, gu)), off, dn)

            def a4_today(x=x, perm=perm, off=off, gu=gu, dn=dn, fmt=fmt):
                g, u = fp4_grouped_linear(gather_rows(x, perm), off, gu, fmt, fuse_act_quant=False).chunk(2, dim=-1)
                return fp4_grouped_linear(F.silu(g) * u, off, dn, fmt, fuse_act_quant=False)

            def a4_fused_producers(x=x, perm=perm, off=off, gu=gu, dn=dn, fmt=fmt):
                h = fp4_grouped_linear(x, off, gu, fmt, fuse_act_quant=False, src_rows=perm.token_of_row)
                return fp4_grouped_linear(h, off, dn, fmt, fuse_act_quant=False, silu_mul=True)
            if fmt == "nvfp4":   # the w4a4 plans keep nvfp4 gate and up apart (a global scale per projection)
                g_, u_ = prepare_expert_weights(w_gu[:, :I], fmt), prepare_expert_weights(w_gu[:, I:], fmt)
                hopper_weight(g_), hopper_weight(u_)

                def a4_split_today(x=x, perm=perm, off=off, g_=g_, u_=u_, dn=dn, fmt=fmt):
                    xs = gather_rows(x, perm)
                    g = fp4_grouped_linear(xs, off, g_, fmt, fuse_act_quant=False)
                    u = fp4_grouped_linear(xs, off, u_, fmt, fuse_act_quant=False)
                    return fp4_grouped_linear(F.silu(g) * u, off, dn, fmt, fuse_act_quant=False)

                def a4_split_producers(x=x, perm=perm, off=off, g_=g_, u_=u_, dn=dn, fmt=fmt):
                    g, u = (fp4_grouped_linear(x, off, w_, fmt, fuse_act_quant=False, src_rows=perm.token_of_row)
                            for w_ in (g_, u_))
                    return fp4_grouped_linear(F.silu(g) * u, off, dn, fmt, fuse_act_quant=False)
                plans.update({"nvfp4_w4a4_split_today": a4_split_today,
                              "nvfp4_w4a4_split_producers": a4_split_producers})
            plans.update({f"{fmt}_w4a16": a16, f"{fmt}_w4a16_swiglu": a16_swiglu, f"{fmt}_w4a4_today": a4_today,
                          f"{fmt}_w4a4_fused_producers": a4_fused_producers})
            try:
                a, b = a4_today(), a4_fused_producers()
                row[f"{fmt}_fused_vs_today_max_abs_diff"] = (a.float() - b.float()).abs().max().item()
            except Exception as e:   # noqa: BLE001
                row[f"{fmt}_fused_check_error"] = repr(e)[:300]
        for name, fn in plans.items():
            try:
                row[f"{name}_us"] = round(time_us([fn], reps=10), 2)
            except Exception as e:   # noqa: BLE001
                row[f"{name}_error"] = repr(e)[:300]
        log(row)
        rows.append(row)
    return rows
