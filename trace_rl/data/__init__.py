"""Trajectory schema, padding helpers, group advantages and replay buffers."""

from trace_rl.data import schema
from trace_rl.data.advantages import GroupAdvantage, GroupAdvantageConfig, group_advantages
from trace_rl.data.padding import (
    densify,
    full_sequence,
    pack_full,
    pad_right,
    pad_value_for,
    to_device,
    trim_response,
    unpad,
)
from trace_rl.data.replay_buffer import (
    GroupSampler,
    ReplayBufferConfig,
    make_replay_buffer,
    set_policy_version,
)

__all__ = [
    "GroupAdvantage",
    "GroupAdvantageConfig",
    "GroupSampler",
    "ReplayBufferConfig",
    "densify",
    "full_sequence",
    "group_advantages",
    "make_replay_buffer",
    "pack_full",
    "pad_right",
    "pad_value_for",
    "schema",
    "set_policy_version",
    "to_device",
    "trim_response",
    "unpad",
]
