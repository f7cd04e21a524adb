"""The opt-in Gluon warp-specialised FP4 W4A16 GEMM (fp4_gemm_gluon.py): launcher checks, config choice and a torch
emulation of its data path (TMA boxes, ring views, decode index algebra, the grid over token tiles) on CPU; on an
sm_90 GPU with Triton 3.6, against the float64 reference (the same as test_fp4_gemm.py's) at M in {1, 5, 16} and
ragged N / K, per config (one or two consumer warpgroups, wgmma overlap, forced split-K), bit-identical to the shipped
kernel at split 1 and M = 16 (same k16 order, fp32 accumulation, epilogue); the wide token tiles (WIDE: 32 / 64 / 128
tokens) at M in {17, 33, 64, 100, 128, 256} against the reference and the shipped kernel."""

import pytest
import torch

from tests.gpu_marks import gpu36
from tests.kernels._compare import rel_err, rel_err_dequant
from trace_rl.backends import get_backend
from trace_rl.kernels.fp4_gemm import GemmConfig
from trace_rl.kernels.fp4_gemm_gluon import (
    DEFAULT,
    SMALL_M,
    SMEM_LIMIT,
    WIDE,
    GluonConfig,
    auto_split,
    config_for,
    fp4_matmul_gluon,
)
from trace_rl.kernels.hopper_fp4 import to_hopper

pytestmark = [pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning"),
              pytest.mark.filterwarnings("ignore:overflow:RuntimeWarning")]


def _weight(N, K, fmt, gen, device="cpu"):
    w = torch.randn(N, K, generator=gen) * torch.exp(torch.randn(N, 1, generator=gen))
    return get_backend("fp4").prepare_weight(w.to(device), fmt)


def test_config_and_launcher_checks(gen):
    with pytest.raises(ValueError, match="num_warps"):
        GluonConfig(num_warps=8, block_n=64).check()
    packed = _weight(48, 512, "nvfp4", gen)
    h = to_hopper(packed.q)
    x = torch.randn(3, 512).to(torch.bfloat16)
    with pytest.raises(ValueError, match="M >= 1"):
        fp4_matmul_gluon(torch.zeros(0, 512, dtype=torch.bfloat16), h)
    with pytest.raises(ValueError, match="block_m"):
        GluonConfig(block_m=48).check()
    with pytest.raises(ValueError, match="shared memory"):      # 4 x 82 KB slots
        fp4_matmul_gluon(torch.zeros(128, 512, dtype=torch.bfloat16), h, GluonConfig(block_m=128, num_warps=8))
    with pytest.raises(ValueError, match="shared memory"):      # mxfp4 at 128 tokens: 2 x 162 KB
        fp4_matmul_gluon(torch.zeros(128, 512, dtype=torch.bfloat16), to_hopper(_weight(48, 512, "mxfp4", gen).q),
                         GluonConfig(block_m=128, num_warps=8, stages=2))
    with pytest.raises(ValueError, match="bf16"):
        fp4_matmul_gluon(x.float(), h)
    with pytest.raises(ValueError, match="columns"):
        fp4_matmul_gluon(torch.zeros(2, 256, dtype=torch.bfloat16), h)
    with pytest.raises(ValueError, match="nvfp4 or mxfp4"):
        fp4_matmul_gluon(x, packed)                                 # a PackedWeight, not its Hopper layout
    with pytest.raises(ValueError, match="16-byte aligned"):      # K = 384 pads to 384 = 1.5 nvfp4 K steps
        fp4_matmul_gluon(torch.zeros(2, 384, dtype=torch.bfloat16), to_hopper(_weight(48, 384, "nvfp4", gen).q))
    with pytest.raises(ValueError, match="16-byte aligned"):      # 768 = 1.5 mxfp4 K steps
        fp4_matmul_gluon(torch.zeros(2, 768, dtype=torch.bfloat16), to_hopper(_weight(48, 768, "mxfp4", gen).q))
    with pytest.raises(ValueError, match="CUDA"):
        fp4_matmul_gluon(x, h)


def test_config_for_token_tiles():
    assert config_for(1) == config_for(16) == config_for(16, "mxfp4", 1536) == SMALL_M
    assert config_for(16, "nvfp4", 768) == DEFAULT          # SMALL_M's 512-column step does not divide 768
    assert SMALL_M.ctas_per_sm(16, "nvfp4") == SMALL_M.ctas_per_sm(8, "mxfp4") == 3
    assert [config_for(M).tile_m(M) for M in (17, 32, 33, 64, 100, 128, 256, 512)] == [32, 32, 64, 64, 128, 128,
                                                                                        128, 128]
    assert [config_for(M, "mxfp4").tile_m(M) for M in (17, 33, 100, 512)] == [32, 64, 64, 64]
    assert [GluonConfig().tile_m(M) for M in (1, 8, 9, 16, 17, 300)] == [8, 8, 16, 16, 16, 16]
    assert GluonConfig(block_m=64).tile_m(40) == 64 and GluonConfig(block_m=64).tile_m(20) == 32
    for fmt, tiles in WIDE.items():
        for bm, c in tiles.items():
            c.check()
            assert c.block_m == bm and c.smem_bytes(bm, fmt) <= SMEM_LIMIT
    assert WIDE["nvfp4"][32].ctas_per_sm(32) == 2 and WIDE["nvfp4"][128].ctas_per_sm(128) == 1


def test_auto_split_keeps_one_wave():
    # 4096x12288 (96 tiles of 128 rows, 16 K steps), 12288x4096 (32 tiles, 48 steps), 2 CTAs per SM
    assert auto_split(96, 16, 264) == 2
    assert auto_split(32, 48, 264) == 8
    assert auto_split(1, 3, 264) == 1          # >= 2 K steps per program
    assert auto_split(400, 16, 264) == 1


CONFIGS = [GluonConfig(), GluonConfig(overlap=True, stages=3), GluonConfig(num_warps=8, maxnreg=80),
           GluonConfig(split_k=3, stages=2)]
MX_CONFIGS = [GluonConfig(stages=2), GluonConfig(num_warps=8, maxnreg=80, overlap=True, stages=2, split_k=2)]
# (format, config, M, N) of every binary the GPU tests build: benchmarks/gemm_gluon.py --precompile-only builds them
GPU_JOBS = [("nvfp4", c, M, 200) for c in CONFIGS for M in (1, 16)] + \
    [("mxfp4", c, M, 200) for c in MX_CONFIGS for M in (1, 16)] + \
    [(f, GluonConfig(), 16, 4096) for f in ("nvfp4", "mxfp4")] + \
    [(f, SMALL_M, M, 200) for f in ("nvfp4", "mxfp4") for M in (1, 16)] + \
    [(f, c, bm, 200) for f, tiles in WIDE.items() for bm, c in tiles.items()] + \
    [("nvfp4", WIDE["nvfp4"][128], 128, 4096), ("nvfp4", WIDE["nvfp4"][64], 64, 4096)]


@pytest.mark.parametrize("cfg", CONFIGS, ids=["default", "overlap_s3", "w8", "split3_s2"])
@pytest.mark.parametrize("M", [1, 5, 16])
@pytest.mark.parametrize("N,K", [(200, 1008), (200, 1520)])
def test_gluon_gemm_matches_reference_gpu(cfg, M, N, K, gen):
    """Ragged N (a partial 128-row tile: TMA zero fill) and K (1008 and 1520 pad to 1024 and 1536 layout columns:
    zero codes, activations past K zero-filled); one N, so one binary per config (benchmarks/gemm_gluon.py
    --precompile-only builds them ahead)."""
    packed = _weight(N, K, "nvfp4", gen, "cuda")
    h = to_hopper(packed.q)
    x = torch.randn(M, K, generator=gen).to(torch.bfloat16).cuda()
    y = fp4_matmul_gluon(x, h, cfg)
    assert y.shape == (M, N) and y.dtype == torch.bfloat16
    assert rel_err_dequant(y, packed, x) < 1e-2
    assert torch.equal(y, fp4_matmul_gluon(x, h, cfg))           # deterministic (split-K in fixed order)


for _m in gpu36:
    test_gluon_gemm_matches_reference_gpu = _m(test_gluon_gemm_matches_reference_gpu)


@pytest.mark.parametrize("cfg", MX_CONFIGS, ids=["s2", "w8_overlap_split2"])
@pytest.mark.parametrize("M", [1, 16])
@pytest.mark.parametrize("N,K", [(200, 1504)])
def test_gluon_gemm_mxfp4_matches_reference_gpu(cfg, M, N, K, gen):
    """mxfp4: 512-column steps (four chunks, one scale word per row and chunk); ragged N and K (1504 pads to 1536)."""
    packed = _weight(N, K, "mxfp4", gen, "cuda")
    h = to_hopper(packed.q)
    x = torch.randn(M, K, generator=gen).to(torch.bfloat16).cuda()
    y = fp4_matmul_gluon(x, h, cfg)
    assert rel_err_dequant(y, packed, x) < 1e-2
    assert torch.equal(y, fp4_matmul_gluon(x, h, cfg))


for _m in gpu36:
    test_gluon_gemm_mxfp4_matches_reference_gpu = _m(test_gluon_gemm_mxfp4_matches_reference_gpu)


def test_gluon_gemm_misaligned_x_and_out_gpu(gen):
    """An x view whose base is not 16-byte aligned (TMA needs it: the launcher copies it) and a given `out`."""
    packed = _weight(200, 1008, "nvfp4", gen, "cuda")
    h = to_hopper(packed.q)
    big = torch.randn(5, 1009, generator=gen).to(torch.bfloat16).cuda()
    x = big[:, 1:]
    out = torch.empty(5, 200, dtype=torch.bfloat16, device="cuda")
    assert fp4_matmul_gluon(x, h, out=out) is out
    assert rel_err_dequant(out, packed, x) < 1e-2


for _m in gpu36:
    test_gluon_gemm_misaligned_x_and_out_gpu = _m(test_gluon_gemm_misaligned_x_and_out_gpu)


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
@pytest.mark.parametrize("N,K", [(12288, 4096), (4096, 12288)])
def test_gluon_gemm_decode_shapes_gpu(fmt, N, K, gen):
    """The issue's shapes at M = 16 (M = 1 runs in benchmarks/gemm_gluon.py against the shipped kernel): the auto
    split against the reference; split 1 bit-identical to the shipped kernel at split 1 (both HGMMA 64x16x16 with
    the same k16 order into one fp32 accumulator, the same epilogue)."""
    M = 16
    from trace_rl.kernels.fp4_gemm import fp4_matmul

    packed = _weight(N, K, fmt, gen, "cuda")
    h = to_hopper(packed.q)
    x = torch.randn(M, K, generator=gen).to(torch.bfloat16).cuda()
    y = fp4_matmul_gluon(x, h)
    assert rel_err_dequant(y, packed, x) < 1e-2
    y1 = fp4_matmul_gluon(x, h, GluonConfig(split_k=1))
    assert torch.equal(y1, fp4_matmul(x, h, config=GemmConfig(16, 128, 128, 1, 4, 3)))


for _m in gpu36:
    test_gluon_gemm_decode_shapes_gpu = _m(test_gluon_gemm_decode_shapes_gpu)


WIDE_M = [17, 33, 64, 100, 128, 256]


@pytest.mark.parametrize("fmt,K", [("nvfp4", 1520), ("mxfp4", 1504)])
@pytest.mark.parametrize("M", WIDE_M)
def test_gluon_gemm_wide_tiles_gpu(fmt, M, K, gen):
    """Token tiles of 32 / 64 / 128 (config_for: wgmma N = BM; M = 256 grids two 128-token tiles, mxfp4 grids 64s):
    odd N (a partial 128-row tile), K padding to whole K steps, partial token tiles (TMA zero fill, masked store),
    the auto split; against the float64 reference and the shipped Triton kernel (its 16-token decode config over
    M / 16 token tiles: one compile per format); deterministic."""
    from trace_rl.kernels.fp4_gemm import fp4_matmul

    N = 199
    packed = _weight(N, K, fmt, gen, "cuda")
    h = to_hopper(packed.q)
    x = torch.randn(M, K, generator=gen).to(torch.bfloat16).cuda()
    y = fp4_matmul_gluon(x, h)
    assert y.shape == (M, N)
    assert rel_err_dequant(y, packed, x) < 1e-2
    shipped = fp4_matmul(x, h, config=GemmConfig(16, 128, 128, 1, 4, 3))   # one binary per format for every M
    assert rel_err(y, shipped) < 8e-3
    assert torch.equal(y, fp4_matmul_gluon(x, h))


for _m in gpu36:
    test_gluon_gemm_wide_tiles_gpu = _m(test_gluon_gemm_wide_tiles_gpu)


@pytest.mark.parametrize("M,split", [(100, 1), (256, 3)])
def test_gluon_gemm_wide_split_and_shapes_gpu(M, split, gen):
    """Forced splits at the wide tiles (split 3: the partials and tickets indexed per (token tile, row tile)), then
    the issue's 4096 x 12288 at M = 256 (auto split) against the reference."""
    packed = _weight(200, 1008, "nvfp4", gen, "cuda")
    h = to_hopper(packed.q)
    x = torch.randn(M, 1008, generator=gen).to(torch.bfloat16).cuda()
    from dataclasses import replace

    cfg = replace(config_for(M), split_k=split)
    y = fp4_matmul_gluon(x, h, cfg)
    assert rel_err_dequant(y, packed, x) < 1e-2
    assert torch.equal(y, fp4_matmul_gluon(x, h, cfg))
    if split == 3:
        packed = _weight(4096, 12288, "nvfp4", gen, "cuda")
        h = to_hopper(packed.q)
        x = torch.randn(M, 12288, generator=gen).to(torch.bfloat16).cuda()
        assert rel_err_dequant(fp4_matmul_gluon(x, h), packed, x) < 1e-2


for _m in gpu36:
    test_gluon_gemm_wide_split_and_shapes_gpu = _m(test_gluon_gemm_wide_split_and_shapes_gpu)


def _box(t: torch.Tensor, start: list, size: list) -> torch.Tensor:
    """A TMA box: t[start : start + size] per dim, zero past t's end."""
    out = torch.zeros(size, dtype=t.dtype)
    src = t[tuple(slice(s, min(s + n, d)) for s, n, d in zip(start, size, t.shape))]
    out[tuple(slice(0, n) for n in src.shape)] = src
    return out


def _rotr(w: torch.Tensor, r: int) -> torch.Tensor:
    u = w.to(torch.int64) & 0xFFFFFFFF
    return ((u >> r) | (u << (32 - r))) & 0xFFFFFFFF


def _bf16(bits: torch.Tensor) -> torch.Tensor:
    return (bits.to(torch.int32) << 16).view(torch.float32).double()


def _emulate(x: torch.Tensor, h, BN: int = 128, BM: int = 16, bk: int | None = None) -> torch.Tensor:
    """The Gluon kernel's data path in torch, step by step as the kernel indexes it: the three TMA boxes (the words
    through the [Kp/128, Np/16, 256] view), the row-major `_reinterpret` views of the ring, the scale-pair and decode
    PTX (bit for bit, products rounded to bf16 like mul.rn.bf16x2), the joins / permute / reshape into the
    [BN, 128] A tile, and A @ x_chunk^T per chunk, per token tile (the grid's third axis: the activation box at row
    pid_m x BM, the store masked to M), split 1. float64 accumulation (the kernel: fp32)."""
    np_, kp = h.padded
    mx = h.fmt == "mxfp4"
    bk = bk or (512 if mx else 256)
    kc_n = bk // 128
    sw_n = bk // (128 if mx else 64)          # scale words per row and step
    v3 = h.values.view(np_ // 16, kp // 128, 256).permute(1, 0, 2)
    sc = h.scales.view(torch.int32)
    M, K = x.shape
    out = torch.zeros(M, h.n, dtype=torch.float64)
    for pid_n, pid_m in [(n, m) for m in range(-(-M // BM)) for n in range(-(-np_ // BN))]:
        acc = torch.zeros(BN, BM, dtype=torch.float64)
        for kb in range(kp // bk):
            w_s = _box(v3, [kc_n * kb, pid_n * BN // 16, 0], [kc_n, BN // 16, 256])
            w_s = w_s.reshape(kc_n, BN // 16, 2, 8, 4, 2, 2)
            s_s = _box(sc, [pid_n * BN, sw_n * kb], [BN, sw_n])
            s_s = s_s.reshape(BN // 16, 2, 8, kc_n) if mx else s_s.reshape(BN // 16, 2, 8, kc_n, 2)
            x_s = _box(x, [pid_m * BM, bk * kb], [BM, bk])
            for kc in range(kc_n):
                w = w_s[kc]
                sw = s_s[:, :, :, kc:kc + 1].to(torch.int64) & 0xFFFFFFFF
                byte = [((sw >> (8 * b)) & 0xFF) * 0x10001 for b in range(4)]                        # prmt
                if mx:
                    p = [b << 7 for b in byte]                                                           # shl
                    se = torch.stack([torch.stack([p[0], p[2]], -1), torch.stack([p[1], p[3]], -1)], -1)
                    so = se = se.expand(*w.shape)
                else:
                    p = [0x70007000 + 16 * b for b in byte]                                              # mad
                    se = torch.stack([p[0], p[2]], -1).expand(*w.shape)
                    so = torch.stack([p[1], p[3]], -1).expand(*w.shape)
                m = 0x81C081C0
                slots = [(w.to(torch.int64) & 0xFFFFFFFF) & m, _rotr(w, 4) & m, _rotr(w, 10) & m,
                         (_rotr(w, 6) & 0x81808180) | (_rotr(w, 14) & 0x00400040)]
                halves = []
                for bits, s in zip(slots, (se, se, so, so)):
                    halves.append([(_bf16(bits >> (16 * e) & 0xFFFF) * _bf16(s >> (16 * e) & 0xFFFF))
                                   .float().to(torch.bfloat16).double() for e in range(2)])
                a, b, c, d = halves
                r0 = torch.stack([torch.stack(a, -1), torch.stack(b, -1)], -1)      # [..., e, c]
                r1 = torch.stack([torch.stack(c, -1), torch.stack(d, -1)], -1)
                v = torch.stack([r0, r1], -1).permute(0, 1, 2, 4, 5, 8, 7, 3, 6).reshape(BN, 128)
                acc += v @ x_s[:, 128 * kc:128 * (kc + 1)].double().T
        rows = torch.arange(pid_n * BN, min((pid_n + 1) * BN, h.n))
        toks = torch.arange(pid_m * BM, min((pid_m + 1) * BM, M))
        part = (acc[rows - pid_n * BN] * h.row_factor[rows, None].double())[:, toks - pid_m * BM].T
        out[toks[:, None], rows[None, :]] = part
    return out


@pytest.mark.parametrize("fmt,M,N,K", [("nvfp4", 5, 200, 1008), ("nvfp4", 16, 136, 1520), ("mxfp4", 3, 200, 1504),
                                       ("mxfp4", 16, 136, 1024), ("nvfp4", 17, 199, 1008), ("nvfp4", 100, 199, 1520),
                                       ("nvfp4", 256, 72, 1008), ("mxfp4", 33, 199, 1504), ("mxfp4", 100, 72, 1024)])
def test_emulated_data_path_matches_reference(fmt, M, N, K, gen):
    """CPU check of what the compile gate cannot see: the descriptors' views and box coordinates, the ring views and
    the decode's index algebra reproduce the weight (the register layouts themselves are proved at compile time by
    `convert_layout(..., assert_trivial=True)`)."""
    from trace_rl.kernels.hopper_fp4 import operand

    packed = _weight(N, K, fmt, gen)
    h = to_hopper(packed.q)
    x = torch.randn(M, K, generator=gen).to(torch.bfloat16)
    c = config_for(M, fmt)
    y = _emulate(x, h, c.block_n, c.tile_m(M), c.bk(fmt))
    ref = x.double() @ (operand(h).double() * h.row_factor[:N, None].double()).T
    assert torch.allclose(y, ref, rtol=1e-9, atol=1e-9 * ref.abs().max().item())
    assert rel_err_dequant(y, packed, x) < 1e-2
