"""sass_wgmma_hazard.a_register_hazards on small SASS loop bodies shaped like fp4_gemm_wide256's main loop: the first
overlap version (one step per iteration: the next decode rewrites the in-flight HGMMA's A registers, nan / inf on
the H200), the fixed one (two register sets, each rewritten after the wait that retired its reader), no overlap."""

from trace_rl.kernels.sass_wgmma_hazard import a_register_hazards

_GROUP_A = ["HGMMA.64x256x16.F32.BF16 R24, R152, gdesc[UR4], R24",
            "HGMMA.64x256x16.F32.BF16 R24, R156, gdesc[UR12], R24, gsb0"]
_GROUP_B = ["HGMMA.64x256x16.F32.BF16 R24, R184, gdesc[UR4], R24",
            "HGMMA.64x256x16.F32.BF16 R24, R188, gdesc[UR12], R24, gsb0"]


def _decode(first: int) -> list[str]:
    return [f"HMUL2.BF16_V2 R{first + i}, R{8 + i}, R7" for i in range(8)]


def test_one_register_set_under_wait_one_is_a_hazard():
    body = ["SYNCS.PHASECHK.TRANS64.TRYWAIT P1, [UR13+0x37890], R4", "LDS.128 R8, [R3]"] + _decode(152) + \
        ["WARPGROUP.ARRIVE"] + _GROUP_A + ["WARPGROUP.DEPBAR.LE gsb0, 0x1", "@P1 BRA 0x18d0"]
    hazards = a_register_hazards(body)
    assert hazards and "R152" in hazards[0] and hazards[0].startswith("HMUL2")


def test_two_register_sets_in_pairs_are_safe():
    body = _decode(152) + _GROUP_A + ["WARPGROUP.DEPBAR.LE gsb0, 0x1"] + _decode(184) + _GROUP_B + \
        ["WARPGROUP.DEPBAR.LE gsb0, 0x1", "@!P1 BRA 0x18d0"]
    assert a_register_hazards(body) == []


def test_full_wait_and_non_destination_operands_are_safe():
    body = _decode(152) + _GROUP_A + ["WARPGROUP.DEPBAR.LE gsb0, 0x0", "STS [R152], R153", "@P1 BRA 0x18d0"]
    assert a_register_hazards(body) == []


def test_wide_destinations_and_the_open_group():
    # LDS.128 R150 writes R150..R153; an uncommitted HGMMA (no gsb0 yet) is in flight too
    body = ["HGMMA.64x256x16.F32.BF16 R24, R152, gdesc[UR4], R24", "LDS.128 R150, [R3]",
            "HGMMA.64x256x16.F32.BF16 R24, R156, gdesc[UR12], R24, gsb0", "WARPGROUP.DEPBAR.LE gsb0, 0x0"]
    hazards = a_register_hazards(body)
    assert len(hazards) == 1 and "LDS.128 R150" in hazards[0] and "(open group)" in hazards[0]
