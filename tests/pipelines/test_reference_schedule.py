"""The reference policy of the KL term (frozen copy, optionally on CPU / in bf16) and LR schedules (warmup +
cosine / linear, equal to transformers' schedules, exact on resume)."""

import pytest
import torch

from trace_rl.config import ConfigError
from trace_rl.pipelines import build
from trace_rl.pipelines.run_log import read_history
from trace_rl.pipelines.schedules import LRScheduleSection, lr_factor, make_lr_scheduler

from .test_run import small, train_records


def train(run_dir):
    return [r for r in read_history(run_dir) if r["kind"] == "train"]


@pytest.mark.parametrize("kind", ["constant", "linear", "cosine"])
def test_schedules_equal_transformers(kind):
    transformers = pytest.importorskip("transformers")
    make = {"constant": lambda o, w, t: transformers.get_constant_schedule_with_warmup(o, w),
            "linear": transformers.get_linear_schedule_with_warmup,
            "cosine": transformers.get_cosine_schedule_with_warmup}[kind]
    total, warmup = 17, 4
    ours_opt, theirs_opt = (torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.3) for _ in range(2))
    ours = make_lr_scheduler(ours_opt, LRScheduleSection(kind=kind, warmup_steps=warmup), total)
    theirs = make(theirs_opt, warmup, total)
    for _ in range(total):
        assert ours_opt.param_groups[0]["lr"] == pytest.approx(theirs_opt.param_groups[0]["lr"], abs=1e-12)
        ours_opt.step(), theirs_opt.step(), ours.step(), theirs.step()


def test_min_lr_ratio_and_bad_warmup():
    cos = LRScheduleSection(kind="cosine", warmup_steps=2, min_lr_ratio=0.1)
    assert lr_factor(0, cos, 10) == 0 and lr_factor(2, cos, 10) == 1 and lr_factor(10, cos, 10) == pytest.approx(0.1)
    lin = LRScheduleSection(kind="linear", min_lr_ratio=0.5)
    assert lr_factor(5, lin, 10) == pytest.approx(0.75)
    with pytest.raises(ConfigError, match="warmup_steps=4 leaves no step"):
        small(4, **{"trainer.lr_schedule.warmup_steps": 4})


SCHEDULE = {"trainer.lr_schedule.kind": "cosine", "trainer.lr_schedule.warmup_steps": 1, "trainer.lr": 1e-3}


def test_pipeline_follows_the_schedule_and_resumes_it_exactly(tmp_path):
    full = build(small(4, **SCHEDULE), run_dir=tmp_path / "full")
    full.run()
    lrs = [r["lr"] for r in train(tmp_path / "full")]
    assert lrs == pytest.approx([1e-3 * lr_factor(k, LRScheduleSection(kind="cosine", warmup_steps=1), 4)
                                 for k in range(4)])
    assert lrs[0] == 0 and lrs[1] == pytest.approx(1e-3)
    build(small(2, **SCHEDULE), run_dir=tmp_path / "part").run()
    build(small(4, **SCHEDULE), run_dir=tmp_path / "part").run(resume=True)
    assert train_records(tmp_path / "part") == train_records(tmp_path / "full")


def test_kl_to_reference_policy(tmp_path):
    pipeline = build(small(2, **{"trainer.loss.kl_to_ref_coeff": 0.5}), run_dir=tmp_path / "run")
    initial = {k: v.clone() for k, v in pipeline.model.state_dict().items()}
    pipeline.run()
    first, second = train(tmp_path / "run")
    assert first["kl_to_ref"] == 0.0            # step 1: the policy is the reference, bit for bit
    assert second["kl_to_ref"] > 0
    ref = pipeline.reference.model
    assert all(torch.equal(ref.state_dict()[k], v) for k, v in initial.items())      # frozen
    assert not any(p.requires_grad for p in ref.parameters())
    assert any(not torch.equal(pipeline.model.state_dict()[k], v) for k, v in initial.items())


def test_reference_on_cpu_in_bfloat16(tmp_path):
    cfg = small(1, **{"trainer.loss.kl_to_ref_coeff": 0.5, "trainer.reference.device": "cpu",
                      "trainer.reference.dtype": "bfloat16"})
    pipeline = build(cfg, run_dir=tmp_path / "run")
    param = next(pipeline.reference.model.parameters())
    assert param.dtype == torch.bfloat16 and param.device.type == "cpu"
    pipeline.run()
    (record,) = train(tmp_path / "run")
    assert 0 <= record["kl_to_ref"] < 1e-2         # bf16 rounding of the same policy: small, finite


def test_no_reference_without_kl(tmp_path):
    assert build(small(1), run_dir=tmp_path / "run").reference is None
