"""Rollout engines behind one interface: native (ours), hf (reference), vllm (adapter)."""
