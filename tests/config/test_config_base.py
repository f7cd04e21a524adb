"""The TraceConfig base: loading from files, dotted overrides, error messages."""

import pytest

from trace_rl.config import ConfigError
from trace_rl.plan import PrecisionPlan


def test_load_by_suffix(tmp_path):
    plan = PrecisionPlan.preset("fp8")
    for suffix in (".yaml", ".toml"):
        path = plan.dump(tmp_path / f"plan{suffix}")
        assert PrecisionPlan.load(path) == plan
    (tmp_path / "plan.json").write_text('{"kv_cache": "mxfp4"}')
    assert PrecisionPlan.load(tmp_path / "plan.json").kv_cache == "mxfp4"


def test_missing_file_and_bad_suffix(tmp_path):
    with pytest.raises(ConfigError, match="not found: .*nope.yaml"):
        PrecisionPlan.load(tmp_path / "nope.yaml")
    (tmp_path / "plan.ini").write_text("")
    with pytest.raises(ConfigError, match="unknown suffix"):
        PrecisionPlan.load(tmp_path / "plan.ini")


def test_overrides_revalidate():
    plan = PrecisionPlan().with_overrides({"kv_cache": "nvfp4"})
    assert plan.kv_cache == "nvfp4"
    with pytest.raises(ConfigError, match="kv_cache"):
        PrecisionPlan().with_overrides({"kv_cache": 3})


def test_wrong_type_names_field():
    with pytest.raises(ConfigError, match="keep_high_precision"):
        PrecisionPlan.parse({"keep_high_precision": 5})


def test_bad_toml_is_a_config_error():
    with pytest.raises(ConfigError, match="invalid TOML"):
        PrecisionPlan.from_toml("kv_cache = ")
