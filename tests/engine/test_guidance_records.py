"""TRACE records leave the GPU: a per-slot ring flushed to host rows every `window` decode steps, prompt
records copied at prefill; the guided trainer gets the rollout's log-probs back from them (exactly, on
CPU in float32; to 1e-6 k3 on the GPU with CUDA graphs and the Triton kernels); host memory does not grow
over steps."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch

from tests.engine.native_helpers import random_prompts
from trace_rl.backends import fake_quant
from trace_rl.correction.guided import guided_trainer
from trace_rl.correction.metrics import drift_metrics
from trace_rl.data import schema as K
from trace_rl.engine.base import SamplingParams
from trace_rl.engine.native import NativeEngine
from trace_rl.models.presets import tiny_model
from trace_rl.objectives.logprobs import response_log_probs
from trace_rl.plan import PrecisionPlan

pytestmark = [pytest.mark.usefixtures("one_torch_thread"),
              pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")]

PLAN = PrecisionPlan.preset("fp4-guided")


def generate(window: int | None, device="cpu", graphs=None, new=20, seed=3, stops=True, attention="auto"):
    model, _ = tiny_model("tiny", seed=0, device=device)
    engine = NativeEngine(model, PLAN, max_batch=4, max_seq_len=48, device=device, dtype=torch.float32,
                          cuda_graphs=graphs, attention=attention)
    if window is not None:
        engine.recorder.set_window(window)
    prompts = random_prompts([5, 9, 3], torch.Generator().manual_seed(1))
    sampling = SamplingParams(n=2, temperature=1.0, max_new_tokens=new, seed=seed,
                              stop_token_ids=(7, 11), ignore_stop=not stops)
    return engine, engine.generate(prompts, sampling)


def rescore(out, sites, device="cpu"):
    trainer, _ = tiny_model("tiny", seed=0, device=device)
    trainer.apply_plan(PLAN)
    args = [out.get(k).to(device) for k in (K.TOKENS_PROMPT, K.MASK_PROMPT, K.TOKENS_RESPONSE, K.MASK_RESPONSE)]
    with torch.no_grad(), guided_trainer(trainer, out, sites) as g:
        lp, _ = response_log_probs(trainer, *args)
    return lp, g


def test_records_through_a_small_ring_equal_a_large_one():
    """Window 3 (a flush every 3 steps, wrapping the ring; 4 slots over 6 samples, so slots are reused):
    the host rows hold exactly the records a 64-position ring gives, at every valid position. (No stop
    tokens: the window changes when the loop harvests, and with stops that changes the samples.)"""
    _, small = generate(window=3, stops=False)
    engine, large = generate(window=None, stops=False)
    assert torch.equal(small[K.TOKENS_RESPONSE], large[K.TOKENS_RESPONSE])
    g_small, g_large = small.get(K.GUIDANCE), large.get(K.GUIDANCE)
    valid = g_large.get("valid")
    assert torch.equal(g_small.get("valid"), valid) and valid.sum() > 0
    assert_same_records(engine, g_small, g_large, valid)
    stats = engine.report()["guidance"]
    assert stats["d2h_bytes"] >= valid.sum() * engine.recorder.bytes_per_token


def assert_same_records(engine, got, want, valid):
    """Every site's scales / global scales / bits agree at the valid positions (the bytes between sites are
    alignment padding, never written)."""
    assert got.get("bytes").shape == want.get("bytes").shape
    for site in set(engine.guidance_sites.values()):
        mine = site.views(got.get("bytes"))
        for name, t in site.views(want.get("bytes")).items():
            assert torch.equal(mine[name][valid], t[valid]), (site.key, name)


def test_guided_trainer_reproduces_rollout_log_probs_exactly():
    """CPU, float32: k3 = 0 and |log p_trainer - log p_rollout| <= 1e-5 (accumulation order only)."""
    engine, out = generate(window=4)
    lp, g = rescore(out, engine.guidance_sites)
    mask = out[K.MASK_RESPONSE]
    k3 = drift_metrics(out[K.LOGP_ROLLOUT], lp, mask)["mismatch_k3"]
    print("guided k3", k3, "max |dlogp|", (lp - out[K.LOGP_ROLLOUT]).abs()[mask].max().item())
    assert k3 <= 1e-9
    torch.testing.assert_close(lp, out[K.LOGP_ROLLOUT], rtol=0, atol=1e-5)
    # one record per distinct input: q/k/v and gate/up share theirs
    assert len(set(engine.guidance_sites.values())) < len(engine.guidance_sites)


def test_trainer_kernel_path_equals_reference_path(monkeypatch):
    """The fused Triton kernels (interpreter) give the reference's log-probs bit for bit end to end."""
    engine, out = generate(window=None, new=10)
    want, _ = rescore(out, engine.guidance_sites)
    from trace_rl.kernels import interpreting

    if not interpreting():
        pytest.skip("needs TRITON_INTERPRET=1 (set by the test suite on CPU machines)")
    monkeypatch.setattr(fake_quant, "kernel_unavailable", lambda x, fmt, record=None: fake_quant_supports(
        x, fmt, record))
    got, _ = rescore(out, engine.guidance_sites)
    assert torch.equal(got, want)


def fake_quant_supports(x, fmt, record):
    from trace_rl.kernels.fake_quant import supports

    return supports(x, fmt, record)


def test_host_records_are_freed_after_each_step(tmp_path):
    """A guided pipeline, 3 steps: each step's host records are released once the replay buffer lets go
    of its batch; at most the current batch's stay alive (no growth). The trainer gets them back exactly."""
    from trace_rl.pipelines import build, default_config

    cfg = default_config().with_overrides({
        "precision.trainer": "guided", "loop.steps": 3, "loop.prompts_per_step": 4, "loop.group_size": 2,
        "loop.eval_every": 0, "loop.eval_prompts": 4, "logging.progress": False, "logging.plot": False})
    pipe = build(cfg, run_dir=tmp_path)
    recorder = pipe.engine.recorder
    alive, sizes = [], []
    begin = recorder.begin

    def tracking_begin(*args):
        begin(*args)
        alive.append(weakref.ref(recorder.host.untyped_storage()))
        sizes.append(recorder.host.numel())

    recorder.begin = tracking_begin
    for _ in range(3):
        record = pipe.train_step()
        gc.collect()
        # the records reach the trainer through the replay buffer (groups shuffled, one tensor per row):
        # float32 on CPU, the guided trainer's log-probs are the rollout's
        assert record["mismatch_k3"] <= 1e-9
        assert sum(r() is not None for r in alive) <= 1, "records of earlier steps are still alive"
    assert len(sizes) == 3 and max(sizes) > 0
    print("host bytes per step", sizes, "bytes per token", recorder.bytes_per_token)


@pytest.mark.gpu
def test_gpu_guided_trainer_matches_rollout():
    """H200, float32 tiny model: Triton GEMM, record and fake-quant kernels; the records come back from
    pinned host memory; k3 <= 1e-6 between the trainer's and the rollout's log-probs. (Attention: the
    float32 torch reference over the FP4 cache, which syncs with the host and so runs eagerly; the decode
    attention kernel computes q.k and p.v in bf16, a mismatch of its own that guidance does not address.)"""
    engine, out = generate(window=8, device="cuda", graphs=False, new=32, attention="reference")
    g = out.get(K.GUIDANCE)
    assert g.get("bytes").device.type == "cpu" and g.get("bytes").is_pinned()
    lp, ctx = rescore(out, engine.guidance_sites, device="cuda")
    mask = out[K.MASK_RESPONSE].cuda()
    rollout = out[K.LOGP_ROLLOUT].cuda()
    k3 = drift_metrics(rollout, lp, mask)["mismatch_k3"]
    print("GPU guided k3", k3, "max |dlogp|", (lp - rollout).abs()[mask].max().item(), "h2d", ctx.h2d_bytes)
    assert k3 <= 1e-6 and ctx.h2d_bytes > 0
    assert engine.report()["guidance"]["d2h_bytes"] > 0


@pytest.mark.gpu
def test_gpu_recording_inside_cuda_graphs_equals_eager():
    """The record kernel captured in the decode graph writes the same records as eager decode."""
    engine, graphed = generate(window=8, device="cuda", graphs=True, new=24, stops=False)
    assert engine.graphs is not None and engine.graphs.captured and engine.report()["cuda_graphs"]
    _, eager = generate(window=8, device="cuda", graphs=False, new=24, stops=False)
    assert torch.equal(graphed[K.TOKENS_RESPONSE], eager[K.TOKENS_RESPONSE])
    valid = eager.get(K.GUIDANCE_VALID)
    assert_same_records(engine, graphed.get(K.GUIDANCE), eager.get(K.GUIDANCE), valid)
    lp, _ = rescore(graphed, engine.guidance_sites, device="cuda")
    mask = graphed[K.MASK_RESPONSE].cuda()
    print("GPU guided k3 with the bf16 decode-attention kernel",
          drift_metrics(graphed[K.LOGP_ROLLOUT].cuda(), lp, mask)["mismatch_k3"])

