"""Async mode on a local Ray cluster (2 CPU workers, state-dict sync): the rollout of step k+1 is launched
before step k trains, so batches are one version old, never older than `max_staleness`."""

import pytest

from tests.distributed.configs import small_pipeline
from trace_rl.data import schema as K
from trace_rl.pipelines import build


@pytest.fixture(scope="module")
def async_pipeline(ray_cluster, tmp_path_factory):
    cfg = small_pipeline(3, **{"distributed.rollout_workers": 2, "distributed.async": True,
                               "distributed.max_staleness": 1, "distributed.weight_sync": "state_dict"})
    p = build(cfg, run_dir=tmp_path_factory.mktemp("ray_async"))
    yield p
    p.engine.shutdown()


def test_async_batches_lag_one_version_within_the_bound(async_pipeline):
    p = async_pipeline
    assert p.buffer.sampler.max_staleness == 1          # the buffer's bound follows distributed.max_staleness
    records = []
    while p.step < p.steps:
        records.append(p.train_step())
        assert p.engine.worker_versions() == [p.step, p.step]
    # step 1 has nothing prefetched; from step 2 on each batch was launched before the previous step trained
    assert [r["rollout_lag"] for r in records] == [0, 1, 1]
    assert all(0 <= r["sample_lag"] <= 1 for r in records)
    assert all(r["sync_mode"] == "state_dict" for r in records)
    assert p.engine._prefetched is None                 # nothing launched past the last step


def test_prefetch_must_be_collected_before_the_next(async_pipeline):
    p = async_pipeline
    prompts = p.train_prompts(0).select(K.TOKENS_PROMPT, K.MASK_PROMPT)
    p.engine.prefetch(prompts, p.sampling)
    with pytest.raises(RuntimeError, match="never collected"):
        p.engine.prefetch(prompts, p.sampling)
    batch = p.engine.generate(prompts, p.sampling)          # collects the prefetched rollout
    assert p.engine._prefetched is None
    assert batch.get(K.POLICY_VERSION).eq(p.engine.policy_version).all()
