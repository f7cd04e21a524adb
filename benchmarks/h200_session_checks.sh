#!/usr/bin/env bash
# A session's first H200 call: the one-command checks that are waiting for the GPU, most important first, each
# started only while its time still fits in the call (BUDGET_S, default 540 s). Each check writes into
# /tmp/h200_checks/<name>/ (its summary.json first among its files); all of them come back as ONE file,
# OUT_DIR/checks.tgz (a call returns at most 8 files), and every summary is printed.
# Usage: benchmarks/h200_session_checks.sh OUT_DIR [NAME ...] (from the repo root, device wheels on PYTHONPATH).
# Checks (NAME: script, seconds it may take):
#   wsync    benchmarks/weight_sync_h200.sh       the engine's fused weight sync, bit-exact on 252 weights + GPU tests
#   presets  every preset's pipeline on the GPU (tests/pipelines/test_presets_gpu.py: 2 steps + bf16 evaluation)
#   engine   the engine's GPU tests (tests/engine/test_native_gpu.py: graph-timed attention choice, split candidates;
#            not its Gluon tests, which fp4engine runs)
#   guided   benchmarks/guided_step_h200.sh       the guided trainer's step against aligned (records as one tensor)
#   grid     benchmarks/engine_grid_h200.sh       issue 16's missed cells with the split candidates
#   gemm     benchmarks/gemm_gluon_h200.sh        the Gluon W4A16 GEMM against the shipped kernel and cuBLAS, M = 1, 16
#   gemmwide GLUON_M=64,256,512 benchmarks/gemm_gluon_h200.sh   the same at M = 64-512 (token tiles 32-128)
#   attn     benchmarks/attention_gluon_h200.sh   the Gluon FP4-KV attention against the shipped kernel and SDPA
#   attnshort benchmarks/attention_short_h200.sh  the Gluon FP4-KV attention's persistent variant (short contexts) vs the
#            shipped Gluon and Triton kernels at B = 313 x L = 257 / 1024 / 4352 / 8447 and 32 x 8k + its GPU tests;
#            named only
#   attnsass benchmarks/attention_sass_h200.sh   the Gluon FP4-KV attention's SASS-reduction variants LEAN (N = 8, two
#            tiles per loop iteration, one-barrier column max) and col_max bit-identical to the shipped config (NaN
#            scales included; GPU tests), then shipped vs lean / colmax / lean_s2 (mxfp4: lean, fold, fold_lean) vs
#            best SDPA at B x L = 32 x 8k, 313 x 8447, 256 x 8k, 32 x 32k, 313 x 257, fraction of the read ceiling;
#            named only
#   trainattn benchmarks/trainer_attention_h200.sh the trainer's float32 GQA attention (expanded K/V, efficient kernel)
#   gemmbound benchmarks/gemm_bound_h200.sh       what bounds the W4A16 GEMM at M <= 16: read floor, load-only /
#            compute-only probes of the shipped loop, occupancy, ncu of one launch
#   gemmcomp benchmarks/gemm_compute_h200.sh     the Gluon GEMM's compute part at M <= 16: shipped vs overlap / two
#            consumer warpgroups / 64x512 tiles at 3 CTAs/SM, full and compute-only, vs cuBLAS (only when named)
#   gemmfix  benchmarks/gemm_fixed_h200.sh       the Gluon GEMM's fixed cost at M <= 16: empty-kernel floor, setup,
#            split-K epilogue (n64_k512 vs n64_nosplit), the fast finish (n64_fin), cuBLAS at K = 256 (only when named)
#   gemmship benchmarks/gemm_ship_h200.sh        the SHIPPED small-M FP4 linear (fp4_linear -> Gluon GEMM + PDL, issue
#            15) vs cuBLAS BF16, the Triton path and gemlite at M = 1/4/16, W4A16 / W4A4 / prequantized, after an
#            RMSNorm too, + its GPU tests (8 parallel shards); named only
#   gemmship2 the same bench for 12288x4096 and 4096x1024 only, no tests (the rows a budget-cut gemmship missed)
#   smallm   benchmarks/smallm_h200.sh           issue 15's last gemlite point (4096x1024, M = 1): the small-weight
#            candidate configs of the Gluon GEMM (split 8 / 2, 256-column steps, two warpgroups) vs the shipped
#            config vs cuBLAS BF16 vs gemlite at M = 1/4/16, W4A16 + W4A4 prequantized, bit identity, + their GPU
#            tests; summary.json's rule_proposal names the SMALL_GRID to set; no torchrl needed; named only
#   m64      benchmarks/m64_h200.sh              issue 15's W4A16 M = 64 target (1.6x cuBLAS): the M = 64 candidate configs
#            of the Gluon GEMM (split 2 / 4, fin epilogue, overlap, 64-row tiles at 2 CTAs/SM, 2 x 32 tokens) vs the
#            wide tile vs cuBLAS BF16 at 4096x12288 / 12288x4096, both formats (M = 128 as time allows), bit identity
#            at the same split, + their GPU tests; summary.json's rule_proposal names the M64_GRID to set; named only
#   midm     benchmarks/midm_h200.sh             issue 15's M = 64 target through the shipped fp4_linear: the mid-M Gluon
#            path (gemm_dispatch.GLUON_MID_M -> mid_m_config, PDL) vs the Triton path vs cuBLAS BF16 at M = 17-64
#            (+96/128 as time allows) on Qwen3-8B's 6 dense shapes, nvfp4 / mxfp4, W4A16 / W4A4, + its 28 GPU tests
#            (incl. an engine decode at B = 33); summary.json: rule_proposal.GLUON_MID_M (the line to paste),
#            issue15_m64 (x cuBLAS at M = 64, target 1.6); < 120 s; named only
#   smallwide SMALLM_SHAPES=... benchmarks/smallm_h200.sh   the same sweep at Qwen3-8B's 4096x12288, 12288x4096,
#            4096x6144, 4096x4096 (K x N; large first) and the 4096x1024 control, with the larger-weight candidates
#            (split 3 / 4, 256-column steps at split 2 / 3 / 6, two warpgroups at split 2 / 4) + their GPU tests;
#            summary.json: rule_proposal (SMALL_GRID to paste: every shape and M bucket where a candidate wins every
#            round by >= 2%), issue_table (cuBLAS BF16 / FP4, shipped and best, per shape / M: issue 15's 2.2x);
#            < 120 s; named only
#   m16      SMALLM_...=... benchmarks/smallm_h200.sh   issue 15's nvfp4 M = 16 target (2.2x cuBLAS; 2.02-2.07x with the
#            earlier candidates): the M = 16 candidates (4 CTAs per SM: q_split2/3/6/8, qn_split8 on 8-token tiles;
#            5: p5_split3/8) + their GPU tests (4 parallel shards), then the sweep at M = 1 / 8 / 12 / 16 on
#            4096x12288 and 12288x4096, both formats, every candidate but k256_split16 (never within 2 waves there)
#            vs shipped vs cuBLAS BF16, 3 rounds, gemlite off; summary.json: rule_proposal.SMALL_GRID (the line to
#            paste; M = 12 and 16 make bucket 16), issue_table (x cuBLAS per shape / M / format), bits_vs_shipped;
#            < 120 s; named only
#   gluoneng the engine's Gluon path GPU tests alone (LEAN the default)
#   gluontests the Gluon attention's GPU tests (every variant, LEAN now the default) + the engine's Gluon path tests
#   attnintf benchmarks/attention_interference.py  the attention alone / the layer's bf16 GEMMs alone / both interleaved
#            (B = 313 x 8447, nvfp4): does what runs around it slow the attention (SM clock under the GEMMs' power)?
#   attnmid  benchmarks/attention_sass.py at the fixed workload's mid contexts (313 x 2048 / 4352 / 8447): the shipped
#            first config vs LEAN vs the persistent LEAN (tail waves), both formats; named only
#   attnfault benchmarks/attention_fault_h200.sh  the Gluon attention's SASS variants' GPU tests one process each
#            (which part faults), then compute-sanitizer memcheck on the first faulting one; named only
#   opgemm   benchmarks/opcache_gemm_m.py        the operand cache's four GEMM shapes at M = 256-512: cuBLAS bf16 -> f32 /
#            bf16, FP8 _scaled_mm -> f32 / row-scaled bf16 (exact and fast accumulation): per layer and x36
#   gpusuite benchmarks/gpu_suite_h200.sh         the whole `pytest -m gpu` suite in 8 parallel shards, cut at what
#            is left of the call (at most 400 s): counts, failed ids with reasons, ids not reached; named only
#   gemm256  benchmarks/gemm_wide256_h200.sh       the 256-token Gluon FP4 GEMM (fp4_gemm_wide256, opt-in) vs
#            cuBLAS BF16 and the existing wide Gluon configs at M = 256/512/64/128, both formats, + its GPU
#            tests; named only
#   skfix    benchmarks/skfix_h200.sh             issue 15's M = 256 / 512 (0.8x cuBLAS): the stream-K 256-token GEMM with
#            the register-side two-segment fix-up (fp4_gemm_wide256_sk2) + its GPU tests, vs cuBLAS BF16 and the old
#            best (wide / w256 / sk_bm128 / sk) at 4096x12288 and 12288x4096, both formats, 3 rounds; the rate probe
#            (w256 over 66 / 96 / 132 tiles + SM clock) says whether all-SM schedules can beat 96 SMs; < 120 s; named
#            only
#   fp4engine benchmarks/engine_fp4_gluon_h200.sh the FP4 engine's decode step with attention forced to the Triton
#            kernel vs the Gluon kernel (Qwen3-8B shape, B = 100 / 256, 8k) and the bf16 engine, after the Gluon
#            engine and kernel GPU tests (which GLUON_IN_AUTO rests on); not in the default list: name it
#   fixedgluon benchmarks/engine_fixed_gluon_h200.sh issue 16's fixed 8k workload (Qwen3-8B, memory filled): bf16,
#            w4a4-kv4 with attention gluon and kernels, w4a4-kv4-mx; NOT a < 120 s check: a whole call (~3-5 min,
#            starts only with >= 300 s left, gets what is left); named only, alone: `... h200_session_checks.sh OUT
#            fixedgluon` (or the script itself); its run includes w4a4-kv4 on gluon with the operand cache
#   opcache  the operand cache's GPU tests (tests/kernels/test_operand_cache.py -m gpu: cached == dequant path
#            bit for bit on 4096x12288 at M = 128/359/512, CUDA-graph replay after an in-place reload); named only
#   opprof   benchmarks/engine_opcache_profile_h200.sh where the fixed workload's FP4 step goes (issue 16): torch.profiler
#            op classes and layer 1's kernels of w4a4-kv4 (Gluon attention, operand cache, B = 313) and bf16 (B = 101)
#            at L = 257 / 8447 (8 of Qwen3-8B's 36 layers, 36-layer estimate), the shared W4A4 input quantization
#            before/after (step ms, logits bit-identical); named only
#   opstack  benchmarks/engine_opstack_h200.sh the stacked operand cache (q/k/v and gate/up of nvfp4 as one GEMM each):
#            w4a4-kv4 step (Gluon, operand cache, B = 313, 8 of Qwen3-8B's layers) at L = 257 / 8447 stacked vs one
#            GEMM per projection (step ms, logits compared), cache GB before/after; then its GPU tests; named only
#   siluexact benchmarks/silu_exact_h200.sh     the fused SiLU x mul + W4A4 quantize of the MLP's down projection (exact
#            SiLU): bits against torch's F.silu(gate) * up quantized apart, us apart vs fused at M = 313 x 12288
#            (CUDA graphs), its GPU tests incl. the engine's decode logits fused / apart (< 90 s); named only
#   engremain benchmarks/engine_remaining_h200.sh issue 16's two missing rollout measurements: native vs HF generate
#            (Qwen3-1.7B, 16 x 256, 1024 new tokens, HF stopped at 120 s, decode rates over the same tokens), then
#            the realistic workload at 64 prompts x 8 (bf16, w4a4-kv4, w4a16, fp8; 2 of Qwen3-8B's layers); NOT a
#            < 120 s check: a whole call (~330-420 s, starts only with >= 360 s left, gets what is left); named
#            only, alone: `... h200_session_checks.sh OUT engremain` (or the script itself)
#   real36   benchmarks/engine_realistic36_h200.sh issue 16's realistic workload on the WHOLE Qwen3-8B (36 layers):
#            32 prompts x 8, lengths median 1500, bf16 / w4a4-kv4 (Gluon + bf16 operand cache) / w4a4-kv4-mx (FP8
#            operand cache) / fp8 / w4a16, one process per plan, each time-guarded; NOT a < 120 s check: a whole call
#            (~490 s, starts only with >= 500 s left, gets what is left); named only, alone:
#            `... h200_session_checks.sh OUT real36` (or the script itself)
#   normquant benchmarks/norm_quant_h200.sh   the fused residual add + RMSNorm + W4A4 activation quantization (issue 16
#            item 3): GPU tests (bit-identical to the two kernels at B = 1 / 313 / 512 x 4096 with NaN/Inf rows; engine
#            logits of 2 Qwen3-8B layers bit-identical with the fusion on/off, nvfp4 and mxfp4), then CUDA-graph us of
#            separate vs fused at B = 1 / 16 / 313 / 512 x 4096 with the bytes floor; < 90 s; named only
#   mlpfuse  benchmarks/mlp_fuse_h200.sh   the MLP tail (issue 16): the stacked gate/up GEMM's FP4 epilogue fused into
#            the SiLU x mul quantize and the MLP input norm fused with the gate/up quantize: GPU tests (bit-identity at
#            313 x 2 x 12288 and odd shapes, NaN rows; engine logits on/off), then CUDA-graph us of today's tail vs the
#            fused at M = 313 / 1 / 16 / 512 and an 8-layer engine step A/B at B = 313, L = 257; < 100 s; named only
#   w4a4prod benchmarks/w4a4_producers_h200.sh   issue 15's W4A4-within-15%-of-W4A16 on the pairs the decoder runs:
#            (add + RMSNorm -> 4096x6144, SiLU x mul -> 12288x4096, attention output -> o_proj 4096x4096) W4A4 with the
#            fused producer + prequantized GEMM vs W4A16 (producer + fp4_linear) vs cuBLAS, W4A4 with its separate
#            quantize launch, nvfp4 / mxfp4, M = 1-512 (+313 for o_proj's quantize), bits fused = apart; < 120 s;
#            named only
#   w4a4pdl  benchmarks/w4a4_pdl_h200.sh   issue 15's W4A4 misses at M <= 16 (o_proj, the MLP's down projection): the
#            W4A4 activation quantize launched with PDL (kernels.linear.QUANTIZE_PDL) vs the plain launch vs W4A16 in
#            CUDA graphs at o_proj 4096x4096, down 12288x4096, qkv 4096x6144, gate_up 4096x12288, nvfp4 / mxfp4,
#            M = 1/4/16 (+64, no PDL: control), + its GPU tests (on / off bit-identical eager and in a graph);
#            summary.json: pytest.failures, bits_ok, rows[].pdl_over_old (< 1 = faster), worst_engine_over_w4a16
#            before / after, over_target_after; < 120 s; named only
#   oprojpf  benchmarks/oprojpf_h200.sh   issue 15's W4A4 o_proj miss (4096x4096, M <= 16): the prefetch-all Gluon GEMM
#            configs (fp4_gemm_gluon_prefetch: the ring holds all of a program's weight steps, issued before the PDL
#            wait on o_proj's own quantize) vs the shipped config vs W4A16, nvfp4 / mxfp4, M = 1/4/8/16, 3 rounds, + the
#            engine pair (Gluon attention B = 16 x 2048 -> o_proj W4A4 in one graph, the attention's new
#            launch_dependents on / off) + its 35 GPU tests; summary.json: bits_ok, points[] (W4A4 / W4A16, target
#            1.15), rule_proposal.W4A4_PDL_GRID (the line to paste), engine[].*_on_over_off; < 120 s; named only
#   moegluon benchmarks/moe_gluon_h200.sh  the opt-in Gluon grouped FP4 GEMM (trace_rl/kernels/fp4_grouped_gluon.py):
#            its GPU tests, then at B = 409 / 512 / 128 / 256 routed tokens gate+up and down vs the Triton grouped
#            kernel, torch._grouped_mm and the cuBLAS expert loop (graph), nvfp4 / mxfp4 (+ W4A4 prequantized);
#            < 120 s; named only
#   moe512   benchmarks/moe512_h200.sh  issue 15's grouped MoE GEMM at 409-512 tokens: every Gluon grouped config that
#            can take 25-32 rows per expert (shipped tiles + fp4_grouped_gluon_candidates: balanced tile order, 3-CTA
#            64-row tiles, overlap) vs torch._grouped_mm / the cuBLAS loop / the Triton kernel / the shipped pick at
#            B = 409 / 512 / 256, gate+up and down, nvfp4 + mxfp4, each bit-compared with the shipped tile; the
#            candidates' GPU tests; SASS per element; summary `tile_rule` = the TILE_RULE line the winners give;
#            < 120 s; named only
#   moewire  benchmarks/moe_wire_h200.sh  the MoE rollout's grouped GEMMs on the Gluon kernel where
#            kernels/grouped_dispatch.py says: the MoE GPU tests (engine decode, gate|up stacked == unstacked at the
#            Qwen3-30B-A3B shape on Gluon, grouped linear vs loop), then one MoE layer's experts with GLUON_GROUPED
#            off vs on (interleaved, same run) at B = 128 / 256 / 512, nvfp4 / mxfp4 W4A16, nvfp4 W4A4: us, kernels
#            taken, graph == eager; < 120 s; named only
#   fp8cache benchmarks/fp8cache_h200.sh   the FP8 operand cache of mxfp4 (kernels/operand_cache_fp8.py): its GPU tests
#            (bit-identical E4M3 operands, accumulator vs float64 and the bf16 cache, graph replay after an in-place
#            reload), then the bf16 cache's cuBLAS GEMM vs torch._scaled_mm (fast accum off / on) and the whole W4A4
#            linear both ways at Qwen3-8B's qkv / gate_up / o_proj / down, M = 128 / 313 / 512; < 120 s; named only
#   mxkvdiag benchmarks/mxkv_diag.py   where LEAN_CHECKED (mxfp4 checked fold) differs from the exact kernel: the GPU
#            test's 'window' corruption split by side (K / V / both) and end (low bytes LO..LO+11 / high 123..134), 2
#            seeds, groups 8 / 16 / 1 / 4-persistent: differing elements and items, max abs / rel difference; < 90 s;
#            named only
#   fp8sync  benchmarks/fp8sync_h200.sh   the FP8 operand cache's weight sync (issue 16): a Qwen3-8B-shaped mxfp4 sync
#            (252 linears) with per-weight exactness reads vs one batched read vs the bf16 cache (fp8_per_weight_ms,
#            fp8_batched_ms, bf16_ms, batched_over_bf16), the E4M3 writer at gate/up 24576x4096 old vs direct
#            (writer_us), writers_bit_identical, fp8_equals_bf16_x32, then its GPU tests (pytest_rc); < 60 s; named only
#   mxkv     benchmarks/mxkv_h200.sh   issue 15's mxfp4 KV attention at >= 0.75 of the read ceiling: LEAN_CHECKED
#            (mx_checked: the 2**5-offset scale fold, exact, out-of-window items recomputed by an exact REDO launch) GPU
#            tests (bit-identical to the exact kernel: in-window extremes, out-of-window and NaN bytes, groups 1-16,
#            persistent, CUDA graph), then exact DEFAULT / LEAN vs LEAN_CHECKED vs best SDPA at 32 x 8k, 256 x 8k,
#            32 x 32k, 313 x 8447; summary.json: green + the line to paste (LEAN_MX_CHECKED = True); < 120 s; named only
#   redopdl  benchmarks/redopdl_h200.sh   issue 15's mxfp4 KV attention at 32 x 8k (0.70 of the read ceiling): LEAN_CHECKED's
#            REDO as a programmatic dependent launch (redo_pdl) — its GPU tests (bit-identical to the exact kernel and
#            the plain REDO, window / loud bytes, groups 1 / 4 / 8, persistent, 9 waves, CUDA graph), then exact LEAN vs
#            LEAN_CHECKED plain REDO vs PDL REDO vs best SDPA at 32 x 8k, 256 x 8k, 32 x 32k, 313 x 8447; summary.json:
#            pdl_speedup, bw_frac, green + the line to paste (LEAN_REDO_PDL = True); < 120 s; named only
# The default order puts first what the stability study's runs depend on (wsync presets engine guided trainattn: ~9 min),
# then the speed checks (grid gemm gemmwide attn gemmbound): a second call,
# `BUDGET_S=... benchmarks/h200_session_checks.sh OUT grid gemm gemmwide attn gemmbound`; fp4engine only when named
# (`benchmarks/h200_session_checks.sh OUT fp4engine`).
set -u
OUT=${1:?usage: $0 OUT_DIR [NAME ...]}
shift
NAMES=${*:-"wsync presets engine guided trainattn grid gemm gemmwide attn gemmbound"}
BUDGET_S=${BUDGET_S:-540}
export PYTHON=${PYTHON:-python3}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
W=/tmp/h200_checks
mkdir -p "$OUT" "$W"
start=$(date +%s)
need() { case $1 in presets) echo 150;; trainattn) echo 62;; fp8sync) echo 62;; engine) echo 90;; fixedgluon) echo 300;; gpusuite) echo 200;;
          engremain) echo 360;; real36) echo 500;; *) echo 122;; esac; }
pytest_check() {   # DIR TIMEOUT_S ARGS...: pytest into DIR/pytest.log, its rc into DIR/summary.json
    local d=$1 t=$2; shift 2
    timeout "$t" $PYTHON -m pytest -v -p no:cacheprovider -rs "$@" > "$d/pytest.log" 2>&1
    local rc=$?
    echo "{\"pytest_rc\": $rc}" > "$d/summary.json"; tail -3 "$d/pytest.log" >> "$d/run.log"
    return $rc
}
for name in $NAMES; do
    left=$(( BUDGET_S - ($(date +%s) - start) ))
    if [ "$left" -lt "$(need "$name")" ]; then echo "[$name] skipped: ${left} s left"; continue; fi
    # a fresh folder: a warm machine keeps /tmp between calls, and a check that fails before writing its
    # summary.json must not show (and tar) an earlier call's; pytest_check appends to run.log
    d="$W/$name"; rm -rf "$d"; mkdir -p "$d"; t0=$(date +%s)
    case $name in
        wsync) bash benchmarks/weight_sync_h200.sh "$d" > "$d/run.log" 2>&1 ;;
        guided) bash benchmarks/guided_step_h200.sh "$d" > "$d/run.log" 2>&1 ;;
        grid) bash benchmarks/engine_grid_h200.sh "$d" > "$d/run.log" 2>&1 ;;
        gemm) bash benchmarks/gemm_gluon_h200.sh "$d" > "$d/run.log" 2>&1 ;;
        gemmwide) GLUON_M=64,256,512 bash benchmarks/gemm_gluon_h200.sh "$d" > "$d/run.log" 2>&1 ;;
        attn) bash benchmarks/attention_gluon_h200.sh "$d" > "$d/run.log" 2>&1 ;;
        attnshort) bash benchmarks/attention_short_h200.sh "$d" > "$d/run.log" 2>&1 ;;
        attnsass) bash benchmarks/attention_sass_h200.sh "$d" > "$d/run.log" 2>&1 ;;
        trainattn) bash benchmarks/trainer_attention_h200.sh "$d" > "$d/run.log" 2>&1 ;;
        gemmbound) bash benchmarks/gemm_bound_h200.sh "$d" > "$d/run.log" 2>&1 ;;
        gemmcomp) bash benchmarks/gemm_compute_h200.sh "$d" > "$d/run.log" 2>&1 ;;
        gemmfix) bash benchmarks/gemm_fixed_h200.sh "$d" > "$d/run.log" 2>&1 ;;
        normquant) bash benchmarks/norm_quant_h200.sh "$d" > "$d/run.log" 2>&1 ;;
        gemmship) bash benchmarks/gemm_ship_h200.sh "$d" > "$d/run.log" 2>&1 ;;
        gemmship2) SHIP_TESTS=0 SHIP_SHAPES=12288x4096,4096x1024 bash benchmarks/gemm_ship_h200.sh "$d" > "$d/run.log" 2>&1 ;;
        smallm) bash benchmarks/smallm_h200.sh "$d" > "$d/run.log" 2>&1 ;;
        m64) bash benchmarks/m64_h200.sh "$d" > "$d/run.log" 2>&1 ;;
        midm) bash benchmarks/midm_h200.sh "$d" > "$d/run.log" 2>&1 ;;
        smallwide) SMALLM_SHAPES=4096x12288,12288x4096,4096x6144,4096x4096,4096x1024 SMALLM_PRECOMPILE_S=50 \
                   SMALLM_TESTS='[[-](split3|split4|k256_split2|k256_split3|k256_split6|w8_split2|w8_split4)-(nvfp4|mxfp4)' \
                   bash benchmarks/smallm_h200.sh "$d" > "$d/run.log" 2>&1 ;;
        m16) SMALLM_SHAPES=4096x12288,12288x4096 SMALLM_MS=1,8,12,16 SMALLM_ROUNDS=3 SMALLM_GEMLITE=0 \
             SMALLM_VARIANTS=q_split2,q_split3,q_split6,q_split8,qn_split8,p5_split3,p5_split8,split2,split3,split4,split8,k256_split2,k256_split3,k256_split4,k256_split6,k256_split8,w8_split2,w8_split4,w8_split8 \
             SMALLM_TEST_FILES="tests/kernels/test_fp4_gemm_gluon_m16.py tests/kernels/test_fp4_gemm_gluon_small_grid.py" \
             SMALLM_TESTS='test_fp4_gemm_gluon_m16.py|[[-](q_split2|q_split3|q_split6|q_split8|qn_split8|p5_split3|p5_split8)-nvfp4' \
             SMALLM_PRECOMPILE_S=50 bash benchmarks/smallm_h200.sh "$d" > "$d/run.log" 2>&1 ;;
        attnfault) bash benchmarks/attention_fault_h200.sh "$d" > "$d/run.log" 2>&1 ;;
        gluontests) pytest_check "$d" 115 -m gpu tests/kernels/test_paged_attention_gluon.py tests/kv/test_gluon_path.py \
                        "tests/engine/test_native_gpu.py::test_gluon_attention_equals_kernels_in_graphs" \
                        "tests/engine/test_native_gpu.py::test_gluon_engine_log_probs_match_trainer" ;;
        gluoneng) pytest_check "$d" 80 -m gpu tests/kv/test_gluon_path.py \
                      "tests/engine/test_native_gpu.py::test_gluon_attention_equals_kernels_in_graphs" \
                      "tests/engine/test_native_gpu.py::test_gluon_engine_log_probs_match_trainer" \
                      "tests/engine/test_native_gpu.py::test_auto_times_gluon_beside_the_kernel" ;;
        attnintf) timeout 100 $PYTHON benchmarks/attention_interference.py --out "$d/interference.json" > "$d/run.log" 2>&1 ;;
        attnmid) timeout 110 $PYTHON benchmarks/attention_sass.py --out "$d/attention_sass.json" --budget-s 90 \
                     --shapes 313x4352,313x2048,313x8447 --variants lean,persistent_lean > "$d/run.log" 2>&1 ;;
        gemm256) bash benchmarks/gemm_wide256_h200.sh "$d" > "$d/run.log" 2>&1 ;;
        skfix) bash benchmarks/skfix_h200.sh "$d" > "$d/run.log" 2>&1 ;;
        opgemm) timeout 110 $PYTHON benchmarks/opcache_gemm_m.py --out "$d/summary.json" --budget-s 85 > "$d/run.log" 2>&1 ;;
        gpusuite) GPU_SUITE_S=$(( left - 20 > 400 ? 400 : left - 20 )) bash benchmarks/gpu_suite_h200.sh "$d" > "$d/run.log" 2>&1 ;;
        moegluon) bash benchmarks/moe_gluon_h200.sh "$d" > "$d/run.log" 2>&1 ;;
        moewire) bash benchmarks/moe_wire_h200.sh "$d" > "$d/run.log" 2>&1 ;;
        moe512) bash benchmarks/moe512_h200.sh "$d" > "$d/run.log" 2>&1 ;;
        mlpfuse) bash benchmarks/mlp_fuse_h200.sh "$d" > "$d/run.log" 2>&1 ;;
        w4a4prod) bash benchmarks/w4a4_producers_h200.sh "$d" > "$d/run.log" 2>&1 ;;
        w4a4pdl) bash benchmarks/w4a4_pdl_h200.sh "$d" > "$d/run.log" 2>&1 ;;
        oprojpf) bash benchmarks/oprojpf_h200.sh "$d" > "$d/run.log" 2>&1 ;;
        presets) pytest_check "$d" 145 tests/pipelines/test_presets_gpu.py ;;
        engine) pytest_check "$d" 85 tests/engine/test_native_gpu.py -k "not gluon" ;;
        opprof) bash benchmarks/engine_opcache_profile_h200.sh "$d" > "$d/run.log" 2>&1 ;;
        opstack) bash benchmarks/engine_opstack_h200.sh "$d" > "$d/run.log" 2>&1 ;;
        siluexact) bash benchmarks/silu_exact_h200.sh "$d" > "$d/run.log" 2>&1 ;;
        opcache) pytest_check "$d" 115 tests/kernels/test_operand_cache.py -m gpu ;;
        fp8cache) bash benchmarks/fp8cache_h200.sh "$d" > "$d/run.log" 2>&1 ;;
        mxkvdiag) timeout 110 $PYTHON benchmarks/mxkv_diag.py --out "$d/summary.json" --seeds 2 > "$d/run.log" 2>&1 ;;
        fp8sync) bash benchmarks/fp8sync_h200.sh "$d" > "$d/run.log" 2>&1 ;;
        mxkv) bash benchmarks/mxkv_h200.sh "$d" > "$d/run.log" 2>&1 ;;
        redopdl) bash benchmarks/redopdl_h200.sh "$d" > "$d/run.log" 2>&1 ;;
        fp4engine) bash benchmarks/engine_fp4_gluon_h200.sh "$d" > "$d/run.log" 2>&1 ;;
        fixedgluon) BUDGET_S=$(( left - 10 )) bash benchmarks/engine_fixed_gluon_h200.sh "$d" > "$d/run.log" 2>&1 ;;
        engremain) BUDGET_S=$(( left - 10 )) bash benchmarks/engine_remaining_h200.sh "$d" > "$d/run.log" 2>&1 ;;
        real36) BUDGET_S=$(( left - 10 )) bash benchmarks/engine_realistic36_h200.sh "$d" > "$d/run.log" 2>&1 ;;
        *) echo "[$name] unknown check" ;;
    esac
    echo "[$name] rc $? in $(( $(date +%s) - t0 )) s"
    [ -f "$d/summary.json" ] && head -c 3000 "$d/summary.json" && echo
done
tar czf "$OUT/checks.tgz" -C "$W" .
echo "total $(( $(date +%s) - start )) s; $OUT/checks.tgz"
