"""A local Ray cluster with 2 CPU rollout workers behind one `RayRolloutEngine`, driven by the pipeline:
every worker holds the current weight version after each sync; the split/merge batch is what two local
engines give on the same prompt chunks; a worker that missed a sync is detected."""

import pytest
import torch

from tests.distributed.configs import small_pipeline
from trace_rl.data import schema as K
from trace_rl.distributed.batches import split_prompts, worker_seed
from trace_rl.distributed.ray_engine import StaleWorkerError
from trace_rl.distributed.transport import to_wire
from trace_rl.engine.native import NativeEngine
from trace_rl.pipelines import build


@pytest.fixture(scope="module")
def pipeline(ray_cluster, tmp_path_factory):
    cfg = small_pipeline(3, **{"distributed.rollout_workers": 2, "distributed.weight_sync": "packed"})
    p = build(cfg, run_dir=tmp_path_factory.mktemp("ray_sync"))
    yield p
    p.engine.shutdown()


def test_pipeline_steps_sync_every_worker(pipeline):
    engine = pipeline.engine
    assert engine.worker_versions() == [0, 0]
    for step in range(1, 4):
        record = pipeline.train_step()
        assert record["policy_version"] == step
        assert engine.worker_versions() == [step, step]            # asked of the workers themselves
        assert engine.worker_versions_at_sync == [step, step]      # what they answered the sync
        assert record["rollout_lag"] == 0 and record["sample_lag"] == 0
        assert record["sync_mode"] == "packed" and record["sync_bytes"] > 0 and record["sync_seconds"] > 0


def test_split_batch_equals_local_engines_on_each_chunk(pipeline, rng):
    """Rows, prompt indices and samples match two in-process engines run on the same chunks and seeds."""
    p = pipeline
    prompts = p.train_prompts(int(torch.randint(100, 10_000, (), generator=rng)))
    sampling = p.sampling.model_copy(update={"seed": int(torch.randint(0, 2**31, (), generator=rng))})
    merged = p.engine.generate(prompts.select(K.TOKENS_PROMPT, K.MASK_PROMPT), sampling)
    n = sampling.n
    assert merged.batch_size[0] == prompts.batch_size[0] * n
    assert torch.equal(merged.get(K.PROMPT_INDEX), torch.arange(prompts.batch_size[0]).repeat_interleave(n))
    assert torch.equal(merged.get(K.TOKENS_PROMPT), prompts.get(K.TOKENS_PROMPT)[merged.get(K.PROMPT_INDEX)])
    local = NativeEngine(p.model, p.config.precision, max_batch=p.config.rollout.max_batch,
                         max_seq_len=p.config.rollout.max_seq_len, pad_token_id=p.pad_token_id)
    chunks = split_prompts(prompts, 2)
    assert len(chunks) == 2
    for worker, (first, chunk) in enumerate(chunks):
        ref = local.generate(chunk, sampling.model_copy(update={"seed": worker_seed(sampling.seed, worker)}))
        rows = slice(first * n, first * n + chunk.batch_size[0] * n)
        width = ref.get(K.TOKENS_RESPONSE).shape[1]
        got = merged[rows]
        assert torch.equal(got.get(K.TOKENS_RESPONSE)[:, :width], ref.get(K.TOKENS_RESPONSE))
        assert not got.get(K.MASK_RESPONSE)[:, width:].any()          # padding added by the merge only
        torch.testing.assert_close(got.get(K.LOGP_ROLLOUT)[:, :width], ref.get(K.LOGP_ROLLOUT), rtol=1e-5, atol=1e-5)


def test_worker_that_missed_a_sync_is_detected(pipeline):
    engine, p = pipeline.engine, pipeline
    current = engine.policy_version
    wire = to_wire(p.model.state_dict())
    ray = pytest.importorskip("ray")
    # worker 0 gets version current+1, worker 1 misses it
    ray.get(engine.workers[0].load_weights.remote(wire, current + 1, False))
    engine.policy_version = current + 1
    prompts = p.train_prompts(0).select(K.TOKENS_PROMPT, K.MASK_PROMPT)
    with pytest.raises(StaleWorkerError, match="worker 1 sampled with policy version"):
        engine.generate(prompts, p.sampling)
    engine.load_weights(p.model.state_dict(), current + 1)         # a full sync heals it
    assert engine.worker_versions() == [current + 1] * 2
    assert engine.generate(prompts, p.sampling).get(K.POLICY_VERSION).eq(current + 1).all()
