"""The `distributed` section: default = one process, `async` spelled as in the issue, checks up front."""

import pytest

from trace_rl.config import ConfigError
from trace_rl.distributed.config import DistributedSection
from trace_rl.pipelines import PipelineConfig, default_config


def test_default_is_one_process_and_changes_nothing():
    cfg = default_config()
    assert not cfg.distributed.enabled
    assert cfg.distributed.buffer_staleness(cfg.loop.max_staleness) == cfg.loop.max_staleness


def test_async_key_round_trips_through_yaml_and_toml():
    cfg = default_config().with_overrides({"distributed.rollout_workers": 2, "distributed.async": True,
                                           "distributed.max_staleness": 3})
    assert cfg.distributed.asynchronous and cfg.distributed.enabled
    assert "async: true" in cfg.to_yaml()
    for text, load in ((cfg.to_yaml(), PipelineConfig.from_yaml), (cfg.to_toml(), PipelineConfig.from_toml)):
        assert load(text) == cfg
    assert cfg.distributed.buffer_staleness(cfg.loop.max_staleness) == 3


@pytest.mark.parametrize("bad,field", [({"async": True}, "rollout_workers >= 1"),
                                       ({"async": True, "rollout_workers": 1, "max_staleness": 0}, "max_staleness"),
                                       ({"trainer_gpus": 0}, "trainer_gpus"), ({"workers": 2}, "workers")])
def test_bad_sections_are_errors_naming_the_field(bad, field):
    with pytest.raises(ConfigError, match=field):
        PipelineConfig.parse({"distributed": bad})
    assert DistributedSection.model_fields["asynchronous"].alias == "async"
