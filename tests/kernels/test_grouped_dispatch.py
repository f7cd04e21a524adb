"""The grouped FP4 GEMM dispatch rule (trace_rl/kernels/grouped_dispatch.py) and the Gluon token-tile rule
(fp4_grouped_gluon.TILE_RULE) on CPU: which kernel and tile run for each (format, K, rows per expert) of the
Qwen3-30B-A3B decode batches the H200 measured, every reason for Triton, the module switch, the once-per-process log,
that CPU tensors take the Triton kernel as before, and that `GroupedQuantLinear` records the kernel and hands the
Gluon launcher the rows the Triton one would get."""

import logging

import pytest
import torch

from trace_rl.kernels import grouped_dispatch as gdp
from trace_rl.kernels.fp4_grouped_gluon import GLUON_VARIANTS, GROUPED_GLUON, tile_config, token_tile
from trace_rl.kernels.grouped_dispatch import grouped_path

E = 128                       # Qwen3-30B-A3B: top-8 of 128 experts, R = 8 B rows
GATE_UP_K, DOWN_K = 2048, 768


def _path(fmt, k, batch, cap=(9, 0), gluon=True, **kw):
    return grouped_path(fmt, k, 8 * batch, E, cap, gluon, **kw)


@pytest.mark.parametrize("fmt,k,batch,want", [
    # nvfp4 (both GEMMs): Gluon at every measured batch (B = 409 gate_up: 117.6 vs 118.6, a tie; down 61.1 vs 72.0)
    *[("nvfp4", k, b, "gluon") for k in (GATE_UP_K, DOWN_K) for b in (16, 128, 256, 409, 512)],
    # mxfp4 gate_up: Gluon at every measured batch (B = 409: the 32x64ob tile 100.7 us vs Triton 105.3, check moe512;
    # before it Triton had won there against the 32-token tile's 116.4)
    ("mxfp4", GATE_UP_K, 128, "gluon"), ("mxfp4", GATE_UP_K, 256, "gluon"), ("mxfp4", GATE_UP_K, 409, "gluon"),
    ("mxfp4", GATE_UP_K, 512, "gluon"),
    # mxfp4 down (K = 768): the launcher refuses it (24-byte scale rows, not 512-column K steps)
    *[("mxfp4", DOWN_K, b, "triton") for b in (128, 256, 409, 512)],
    # above 32 rows per expert (B > 512) nothing was measured
    ("nvfp4", GATE_UP_K, 513, "triton"), ("mxfp4", GATE_UP_K, 1024, "triton"),
])
def test_rule_at_the_measured_batches(fmt, k, batch, want):
    path, why = _path(fmt, k, batch)
    assert path == want, why


def test_every_reason_for_triton(monkeypatch):
    cases = [(dict(cap=(10, 0)), "not an sm_90"), (dict(cap=(8, 0)), "not an sm_90"), (dict(cap=None), "not an sm_90"),
             (dict(gluon=False), "Gluon is not importable"), (dict(explicit_config=True), "explicit Triton GemmConfig"),
             (dict(fused_act_quant=True), "FUSE_ACT_QUANT"), (dict(bias_ok=False), "bias"),
             (dict(enabled=False), "GLUON_GROUPED is off")]
    for kw, why in cases:
        path, reason = _path("nvfp4", GATE_UP_K, 256, **kw)
        assert path == "triton" and why in reason, (kw, reason)
    assert grouped_path("nvfp4", 2048, 0, E, (9, 0), True) == ("triton", "no rows")
    assert "format" in grouped_path("fp8", 2048, 64, E, (9, 0), True)[1]
    assert "not a multiple" in grouped_path("nvfp4", 1280 + 128, 64, E, (9, 0), True)[1]   # 1408: 5.5 steps of 256
    assert "not a multiple" in grouped_path("mxfp4", 768, 64, E, (9, 0), True)[1]
    assert "not measured" in _path("nvfp4", GATE_UP_K, 600)[1]
    monkeypatch.setitem(gdp.TRITON_FASTER, "mxfp4", ((20, 28),))      # a measured Triton range, as before moe512
    assert "Triton kernel measured faster" in _path("mxfp4", GATE_UP_K, 409)[1]


def test_rule_is_independent_of_n():
    """The stacked gate | up GEMM and the unstacked gate and up must take one kernel and tile (tests compare their
    bits): the rule has no N input, and the tile depends on rows, experts and format only."""
    import inspect

    assert "n" not in inspect.signature(grouped_path).parameters
    assert list(inspect.signature(token_tile).parameters) == ["rows", "n_experts", "fmt"]


def test_token_tile_by_mean_rows_per_expert():
    batches = (64, 128, 192, 256, 320, 409, 448, 512)           # mean 4, 8, 12, 16, 20, 25.6, 28, 32
    assert [token_tile(8 * b, E, "nvfp4") for b in batches] == [16, 16, 16, 32, 32, "32d", "32d", "32d"]
    assert [token_tile(8 * b, E, "mxfp4") for b in batches] == [16, 16, 16] + ["32x64ob"] * 4 + [64]
    assert token_tile(0, E, "nvfp4") == 16 and token_tile(8 * 4096, E, "nvfp4") == "32d"
    assert tile_config("nvfp4", "64x64") is GLUON_VARIANTS["64x64"]
    assert tile_config("mxfp4", 32) is GROUPED_GLUON["mxfp4"][32]
    with pytest.raises(ValueError, match="no mxfp4 tile"):
        tile_config("mxfp4", "48")
    with pytest.raises(ValueError, match="format"):
        token_tile(64, E, "fp8")


def test_no_triton_range_since_the_moe512_tiles():
    """TRITON_FASTER held mxfp4's 20-28 rows per expert until check `moe512` measured the 32x64ob tile faster than
    Triton there (B = 409): every measured mean up to GLUON_MAX_MEAN now takes a Gluon tile."""
    assert gdp.TRITON_FASTER == {"nvfp4": (), "mxfp4": ()}
    for fmt in ("nvfp4", "mxfp4"):
        for b in (64, 256, 409, 512):
            assert gdp.grouped_path(fmt, 2048, 8 * b, E, (9, 0), True)[0] == "gluon"


def test_cpu_takes_triton_and_logs_once(monkeypatch, caplog):
    monkeypatch.setattr(gdp, "_LOGGED", set())
    with caplog.at_level(logging.INFO, logger="trace_rl.kernels"):
        for _ in range(3):
            assert gdp.grouped_gemm(64, torch.device("cpu"), "nvfp4", 2048, E) == "triton"
    lines = [r.getMessage() for r in caplog.records if "grouped FP4 GEMMs" in r.getMessage()]
    assert len(lines) == 1 and "Triton fp4_grouped_matmul" in lines[0] and "not an sm_90" in lines[0]


def test_switch_off_is_logged(monkeypatch, caplog):
    monkeypatch.setattr(gdp, "_LOGGED", set())
    monkeypatch.setattr(gdp, "GLUON_GROUPED", False)
    with caplog.at_level(logging.INFO, logger="trace_rl.kernels"):
        assert gdp.grouped_gemm(64, torch.device("cpu"), "nvfp4", 2048, E) == "triton"
    assert any("GLUON_GROUPED is off" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("act", ["bf16", "nvfp4"])
def test_grouped_linear_records_and_feeds_the_gluon_launcher(act, monkeypatch, rng):
    """With the rule answering "gluon" (CPU tensors: a stand-in launcher that runs the Triton kernel in the
    interpreter), `GroupedQuantLinear` records experts.fp4_grouped.gluon and the Gluon launcher gets the rows, row
    scales and zero tail the Triton kernel gets: the output equals the Triton path's. With the rule's own answer on
    CPU the record is experts.fp4_grouped.triton."""
    from trace_rl.backends.grouped_linear import GroupedQuantLinear
    from trace_rl.kernels import fp4_grouped, fp4_grouped_gluon, interpreting, linear
    from trace_rl.models.grouped import gather_rows, permute

    if not interpreting():
        pytest.skip("runs the Triton kernel on CPU tensors through the interpreter")
    w = torch.randn(3, 24, 64, generator=rng)
    g = GroupedQuantLinear(w, "nvfp4", act)
    g.force_path = "fp4_grouped"
    ids = torch.tensor([[0, 2], [2, 1], [0, 1]])
    perm = permute(ids, 3, 1)
    x = gather_rows(torch.randn(3, 64, generator=rng).to(torch.bfloat16), perm)
    want = g(x, perm.ends)
    assert g.backend.paths.last == "experts.fp4_grouped.triton"
    calls = []

    def launcher(xb, offsets, h, row_scale=None, bias=None, out_dtype=torch.bfloat16, zero_tail=False):
        calls.append((xb.shape, row_scale is not None, zero_tail))
        return fp4_grouped.fp4_grouped_matmul(xb, offsets, h, row_scale, bias, out_dtype, zero_tail=zero_tail)

    monkeypatch.setattr(fp4_grouped_gluon, "fp4_grouped_matmul_gluon", launcher)
    monkeypatch.setattr(linear, "grouped_gemm_path", lambda *a, **k: "gluon")
    before = g.backend.paths.counts.get("experts.fp4_grouped", 0)
    got = g(x, perm.ends)
    assert g.backend.paths.last == "experts.fp4_grouped.gluon"
    assert g.backend.paths.counts["experts.fp4_grouped"] == before + 1
    assert calls == [(torch.Size((6, 64)), act != "bf16", True)]
    assert torch.equal(got, want)


def test_gluon_path_refuses_fused_w4a4(rng):
    from trace_rl.backends.fp4 import prepare_expert_weights
    from trace_rl.kernels.linear import fp4_grouped_linear

    experts = prepare_expert_weights(torch.randn(2, 16, 32, generator=rng), "nvfp4")
    x = torch.randn(4, 32, generator=rng).to(torch.bfloat16)
    offsets = torch.tensor([0, 2, 4], dtype=torch.int32)
    with pytest.raises(ValueError, match="prequantized"):
        fp4_grouped_linear(x, offsets, experts, "nvfp4", fuse_act_quant=True, path="gluon")
