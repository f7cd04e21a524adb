"""FP4 GEMM (W4A16, W4A4) on the Hopper layout against a float64 reference of the emulated semantics, at odd
shapes; the in-kernel split-K reduction; the pre-quantized W4A4 entry; in-place layout refresh."""

import pytest
import torch

from trace_rl.backends import get_backend
from trace_rl.formats import get_format, per_token
from trace_rl.kernels import fp4_linear
from trace_rl.kernels.fp4_gemm import GemmConfig
from trace_rl.kernels.linear import fp4_linear as fp4_linear_cfg

pytestmark = [pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning"),
              pytest.mark.filterwarnings("ignore:overflow:RuntimeWarning")]


def _reference(x, packed, act_fmt, bias):
    """float64: quantize-dequantize the activations (W4A4) and the weight, then matmul."""
    xf = x.float()
    if act_fmt != "bf16":
        xf = get_format(per_token(act_fmt)).fake_quantize(xf)
    y = xf.double() @ packed.q.dequantize().double().T
    return y if bias is None else y + bias.double()


def _rel_err(y, ref):
    return ((y.double().cpu() - ref).norm() / ref.norm()).item()


def _weight(N, K, fmt, gen):
    w = torch.randn(N, K, generator=gen) * torch.exp(torch.randn(N, 1, generator=gen))
    return get_backend("fp4").prepare_weight(w, fmt)


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
@pytest.mark.parametrize("act", ["bf16", "fp4"])
@pytest.mark.parametrize("M", [1, 3, 17])
def test_fp4_linear_matches_reference(fmt, act, M, device, gen):
    N, K = 40, 96          # neither a multiple of the N tile nor of the K tile
    act_fmt = fmt if act == "fp4" else "bf16"
    packed = _weight(N, K, fmt, gen)
    x = torch.randn(M, K, generator=gen).to(torch.bfloat16)
    bias = torch.randn(N, generator=gen) if M != 3 else None
    ref = _reference(x, packed, act_fmt, bias)
    packed_dev = packed.__class__(packed.fmt, N, K, q=packed.q.to(device))
    y = fp4_linear(x.to(device), packed_dev, act_fmt, None if bias is None else bias.to(device))
    assert y.shape == (M, N) and y.dtype == x.dtype
    assert _rel_err(y, ref) < 1e-2


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_fp4_linear_split_k_and_tails(fmt, device, gen):
    """Split-K in one launch (3 splits over 5 K blocks, ragged N and M tiles), a float32 input and 3-D
    leading dims; the split result is deterministic and the counters are left at zero for the next call."""
    from trace_rl.kernels.fp4_gemm import tile_counters

    N, K = 40, 608
    packed = _weight(N, K, fmt, gen)
    packed_dev = packed.__class__(packed.fmt, N, K, q=packed.q.to(device))
    x = torch.randn(17, K, generator=gen)
    cfg = GemmConfig(16, 64, 128, split_k=3, decode=0 if device == "cpu" else 1, num_warps=4, num_stages=2)
    y = fp4_linear_cfg(x.to(device), packed_dev, fmt, None, config=cfg)
    assert y.dtype == torch.float32
    assert _rel_err(y, _reference(x, packed, fmt, None)) < 1e-2
    assert torch.equal(fp4_linear_cfg(x.to(device), packed_dev, fmt, None, config=cfg), y)
    assert int(tile_counters(device, 1).abs().sum()) == 0
    y3 = fp4_linear(x.reshape(1, 17, K).to(device), packed_dev, "bf16")
    assert y3.shape == (1, 17, N)
    assert _rel_err(y3.reshape(17, N), _reference(x.to(torch.bfloat16), packed, "bf16", None)) < 1e-2


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_fp4_linear_large_m_tiles(fmt, device, gen):
    """The M > 64 tiles the launcher picks (128x128, 256x128; split 1 and 4 over ragged M, N, K tails), W4A4:
    one 256-row program per output tile (the wide tile's accumulator covers all 300 rows in two M tiles)."""
    from trace_rl.kernels.fp4_gemm import LARGE_M, WIDE_M

    N, K, M = 72, 544, 300
    packed = _weight(N, K, fmt, gen)
    packed_dev = packed.__class__(packed.fmt, N, K, q=packed.q.to(device))
    x = torch.randn(M, K, generator=gen).to(torch.bfloat16)
    ref = _reference(x, packed, fmt, None)
    for base, split in ((WIDE_M, 1), (LARGE_M, 4)):
        cfg = GemmConfig(**{**base.__dict__, "split_k": split, "decode": 0 if device == "cpu" else 1})
        y = fp4_linear_cfg(x.to(device), packed_dev, fmt, None, config=cfg)
        assert _rel_err(y, ref) < 1e-2, cfg


def test_default_config_large_m_follows_the_cost_model():
    """M > 64: the cheapest modelled (tile, split); the measured H200 winners it must reproduce
    (kernels_h200_hopper_sweep.json): 12288x4096 -> 256x128 at M = 256, 128x128 at M = 128 and 512; the MoE qkv
    (5120x2048) at M = 471 -> 256x128 (80 programs, one wave, instead of 160 of 128x128); small N -> split 4."""
    from trace_rl.kernels.fp4_gemm import LARGE_M, LARGE_M_STEP_US, WIDE_M, default_config, large_m_cost_us

    def pick(M, N, K):
        c = default_config(M, N, K, 132)
        return c.block_m, c.block_n, c.split_k

    assert pick(256, 12288, 4096) == (256, 128, 1)
    assert pick(128, 12288, 4096) == (128, 128, 1)
    assert pick(512, 12288, 4096) == (128, 128, 1)
    assert pick(471, 5120, 2048) == (256, 128, 1)
    assert pick(128, 2048, 4096) == (128, 128, 4)
    assert pick(64, 12288, 4096)[0] == 64                      # M <= 64 keeps its own buckets
    for M, N, K in ((65, 1000, 300), (471, 2048, 4096), (1000, 4096, 12288)):
        c = default_config(M, N, K, 132)
        best = min(large_m_cost_us(M, N, K, b, us, s, 132) for b, us in LARGE_M_STEP_US for s in (1, 2, 4))
        base = WIDE_M if c.block_m == 256 else LARGE_M
        step = dict((id(b), us) for b, us in LARGE_M_STEP_US)[id(base)]
        assert large_m_cost_us(M, N, K, base, step, c.split_k, 132) == best


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_prequantized_entry_equals_w4a4(fmt, device, gen):
    """`fp4_linear_prequantized` on what the quantize kernel emits = `fp4_linear(x, packed, fmt)`, bit for bit."""
    from trace_rl.kernels import fp4_linear_prequantized
    from trace_rl.kernels.row_quantize import quantize_dequant_bf16

    N, K = 64, 256
    packed = _weight(N, K, fmt, gen)
    packed_dev = packed.__class__(packed.fmt, N, K, q=packed.q.to(device))
    x = torch.randn(5, K, generator=gen).to(torch.bfloat16).to(device)
    xq, rs = quantize_dequant_bf16(x, per_token(fmt))
    y = fp4_linear_prequantized(xq, rs, packed_dev)
    assert torch.equal(y, fp4_linear(x, packed_dev, fmt))
    with pytest.raises(ValueError, match="per-token global scale"):
        fp4_linear_prequantized(xq, None if fmt == "nvfp4" else torch.ones(5, device=device), packed_dev)


def test_layout_refresh_is_in_place(device, gen):
    """Weight sync rewrites `q` in place; `refresh_layouts` re-derives the Hopper layout into the same
    tensors (a captured CUDA graph keeps reading them) and the next call sees the new weight."""
    from trace_rl.kernels.linear import hopper_weight

    N, K = 64, 128
    packed = _weight(N, K, "nvfp4", gen)
    packed = packed.__class__("nvfp4", N, K, q=packed.q.to(device))
    x = torch.randn(3, K, generator=gen).to(torch.bfloat16).to(device)
    y0 = fp4_linear(x, packed)
    h = hopper_weight(packed)
    ptr = h.values.data_ptr()
    new = get_backend("fp4").prepare_weight(torch.randn(N, K, generator=gen), "nvfp4").q
    for dst, src in ((packed.q.codes, new.codes), (packed.q.scales, new.scales),
                     (packed.q.global_scale, new.global_scale)):
        dst.copy_(src.to(device))
    packed.refresh_layouts()
    assert hopper_weight(packed) is h and h.values.data_ptr() == ptr
    y1 = fp4_linear(x, packed)
    assert _rel_err(y1, _reference(x.cpu(), packed.__class__("nvfp4", N, K, q=new), "bf16", None)) < 1e-2
    assert not torch.equal(y0, y1)


def test_fp4_linear_nan_weight_block_propagates(device, gen):
    packed = _weight(16, 64, "nvfp4", gen)
    scales = packed.q.scales.clone()
    scales.view(torch.uint8)[3, 1] = 0x7F                      # a NaN block scale in output row 3
    q = packed.q.__class__(packed.q.codes, scales, packed.q.global_scale, packed.q.shape, packed.q.dtype, "nvfp4")
    packed_dev = packed.__class__("nvfp4", 16, 64, q=q.to(device))
    y = fp4_linear(torch.randn(2, 64, generator=gen).to(torch.bfloat16).to(device), packed_dev).cpu()
    assert y[:, 3].isnan().all() and not y[:, [0, 1, 2, 4]].isnan().any()


def test_fp4_linear_rejects_mismatched_formats(device, gen):
    packed = _weight(16, 64, "nvfp4", gen)
    with pytest.raises(ValueError, match="not supported"):
        fp4_linear(torch.zeros(1, 64, device=device), packed, "mxfp4")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
@pytest.mark.parametrize("M,N,K", [(1, 1024, 4096), (17, 4096, 12288), (64, 4096, 4096), (200, 12288, 4096)])
def test_fp4_gemm_qwen_shapes_gpu(fmt, M, N, K, gen):
    """Decode and prefill shapes with the GPU configs (split-K included), each E2M1 decode mode (pure
    Triton, PTX); the float64 reference is computed on the GPU."""
    from trace_rl.kernels.fp4_gemm import default_config

    packed = _weight(N, K, fmt, gen)
    packed_dev = packed.__class__(packed.fmt, N, K, q=packed.q.to("cuda"))
    x = torch.randn(M, K, generator=gen).to(torch.bfloat16).cuda()
    base = default_config(M, N, K, torch.cuda.get_device_properties(0).multi_processor_count)
    for act_fmt in ("bf16", fmt):
        ref = _reference(x, packed_dev, act_fmt, None)
        for decode in (0, 1):
            cfg = base.__class__(**{**base.__dict__, "decode": decode})
            y = fp4_linear_cfg(x, packed_dev, act_fmt, None, config=cfg)
            err = ((y.double() - ref).norm() / ref.norm()).item()
            assert err < 1e-2, f"act {act_fmt} decode {decode}: relative error {err}"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_fp4_backend_uses_triton_on_gpu(fmt, gen):
    """FP4Backend on CUDA: path fp4.triton, kernel-quantized weights equal the reference's, and the
    QuantLinear forward agrees with the emulated path."""
    from trace_rl.backends import QuantLinear
    from trace_rl.backends.fp4 import emulated_linear

    backend = get_backend("fp4")
    assert backend.available("cuda").path == "fp4.triton"
    w = torch.randn(96, 256, generator=gen).to(torch.bfloat16)
    layer = QuantLinear(w.cuda(), fmt, act_fmt=fmt)
    ref_q = get_format(fmt).quantize(w)
    assert torch.equal(layer.w_codes.cpu(), ref_q.codes)
    x = torch.randn(5, 256, generator=gen).to(torch.bfloat16).cuda()
    y = layer(x)
    assert backend.paths.last == "fp4.triton"
    ref = emulated_linear(x, layer.packed, fmt, None)
    assert ((y.double() - ref.double()).norm() / ref.double().norm()).item() < 1e-2
    layer.load_weight(w.cuda() * 2)                 # weight sync: the cached layout is re-derived
    assert ((layer(x).double() - 2 * y.double()).norm() / y.double().norm()).item() < 1e-2
