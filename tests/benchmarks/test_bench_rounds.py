"""kernel_baselines.interleaved_rounds / round_stats, the timing rounds of the m64, smallm and midm sweeps: the order
alternates round by round, a failing timing loses only its own point (noted in errors), and the stats are the mean of
the round medians (CPU; the sweeps' own bookkeeping: test_smallm_sweep.py)."""

import kernel_baselines as kb


def test_rounds_alternate_and_keep_going_past_a_failure():
    order, errors = [], []

    def time_one(n):
        order.append(n)
        if n == "b" and len(order) > 3:
            raise RuntimeError("launch failed")
        return {"a": 1.0, "b": 2.0, "c": 3.0}[n] + len(order) / 1000

    rounds = kb.interleaved_rounds({"a": 0, "b": 0, "c": 0}, time_one, 3, errors, "nvfp4 4096x4096 M 64")
    assert order == ["a", "b", "c", "c", "b", "a", "a", "b", "c"]
    assert rounds == {"a": [1.001, 1.006, 1.007], "b": [2.002], "c": [3.003, 3.004, 3.009]}
    assert errors == ["nvfp4 4096x4096 M 64 b timing: RuntimeError('launch failed')"] * 2
    assert kb.round_stats({**rounds, "d": []}) == {
        "us": {"a": 1.005, "b": 2.002, "c": 3.005},
        "rounds_us": {"a": [1.001, 1.006, 1.007], "b": [2.002], "c": [3.003, 3.004, 3.009]}}
