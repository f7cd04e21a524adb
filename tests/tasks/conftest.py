"""A fresh seed per test run (printed, so a failure can be replayed)."""

import os

import pytest


@pytest.fixture
def seed() -> int:
    value = int.from_bytes(os.urandom(4), "little")
    print(f"task seed: {value}")
    return value
