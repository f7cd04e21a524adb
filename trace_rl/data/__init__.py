"""Trajectory schema and replay buffers."""

from trace_rl.data import schema

__all__ = ["schema"]
