"""A tiny end-to-end run on CPU: collector -> replay buffer -> trainer log-probs -> corrections -> loss ->
optimizer -> weight sync. The rollout model runs in bfloat16 and the trainer in float32, so there is real
drift for the corrections and metrics to see."""

import copy
import math

import torch

from tests.tiny_lm import TinyLM
from trace_rl.collectors import PromptBatches, RolloutCollector
from trace_rl.correction import METRIC_NAMES, CorrectionsConfig, DriftMetrics
from trace_rl.data import GroupAdvantage, make_replay_buffer, set_policy_version
from trace_rl.data import schema as K
from trace_rl.engine.base import SamplingParams
from trace_rl.engine.recompute import RecomputeEngine
from trace_rl.objectives import GRPOLoss, TrainerLogProbs

PROMPTS = [[3, 5, 7], [4], [9, 1], [2, 2, 2, 2], [6, 5], [8, 3]]


def reward_fn(batch):
    """Share of the response's real tokens that are even."""
    tokens, mask = batch[K.TOKENS_RESPONSE], batch[K.MASK_RESPONSE]
    return ((tokens % 2 == 0) & mask).sum(1) / mask.sum(1).clamp_min(1)


def test_tiny_end_to_end_run():
    torch.manual_seed(0)
    trainer = TinyLM(vocab_size=12, seed=0)
    engine = RecomputeEngine(copy.deepcopy(trainer).to(torch.bfloat16))  # low-precision rollout
    sampling = SamplingParams(n=4, temperature=1.0, max_new_tokens=6, stop_token_ids=(1,), seed=0)
    buffer = make_replay_buffer(256, max_staleness=1)
    collector = RolloutCollector(engine, PromptBatches(PROMPTS, batch_size=3, seed=0), reward_fn, sampling,
                                 total_batches=4, replay_buffer=buffer, postproc=GroupAdvantage())
    recompute = TrainerLogProbs.from_sampling(trainer, sampling)
    corrections = CorrectionsConfig.parse({"corrections": [
        {"kind": "token_tis", "params": {"C": 2.0}},
        {"kind": "geo_reject", "params": {"lo": 0.5, "hi": 2.0}},
    ]}).build()
    drift = DriftMetrics()
    loss_fn = GRPOLoss(trainer, temperature=sampling.temperature)
    optimizer = torch.optim.Adam(loss_fn.parameters(), lr=1e-2)

    logs = []
    for step, _ in enumerate(collector):
        set_policy_version(buffer, collector.policy_version)
        batch = buffer.sample(8)  # two whole groups
        assert (batch[K.POLICY_VERSION] >= collector.policy_version - 1).all()  # staleness bound
        recompute(batch)
        corrections(batch)
        report = drift(batch)
        for _epoch in range(2):  # ("log_probs", "old") stays fixed across the epochs on a batch
            out = loss_fn(batch)
            loss = sum(v for k, v in out.items() if k.startswith("loss_"))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        collector.update_policy_weights_(trainer.state_dict(), version=step + 1)
        logs.append({"loss": loss.item(), **{k: float(v.detach()) for k, v in out.items()}, **report.flat()})

    assert len(logs) == 4
    for entry in logs:
        assert math.isfinite(entry["loss"])
        assert set(METRIC_NAMES) <= set(entry)
        assert any(k.startswith("mismatch_by_position/") for k in entry)
        assert entry["abs_log_ratio_mean"] > 0  # bf16 rollout vs fp32 trainer: measurable drift
        assert 0 < entry["ess"] <= 1
    assert any(entry["loss"] != 0 for entry in logs)  # the rewards carried a learning signal
    assert all(entry["ratio_mean"] != 1 for entry in logs)  # second epoch: π_θ moved away from π_old
    assert engine.policy_version == 4
    # the engine received the trainer's weights (cast to bf16)
    torch.testing.assert_close(engine.model.head.weight.float(), trainer.head.weight.detach(), rtol=1e-2, atol=1e-2)
