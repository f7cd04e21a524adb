"""The summary step shared by the one-command H200 checks (benchmarks/*_h200.sh): each ends in a python heredoc that
builds a dict from its rcs, logs and result JSON, then `write`s it. `tail` of a missing log is [] (a check cut before
its step ran), so the summary is still written."""

from __future__ import annotations

import json
import os


def tail(out: str, name: str, n: int) -> list[str]:
    """The last `n` lines of OUT/name, [] where it is missing."""
    path = os.path.join(out, name)
    return open(path).read().strip().splitlines()[-n:] if os.path.exists(path) else []


def write(out: str, summary: dict, limit: int | None = None) -> None:
    """OUT/summary.json, and the same printed (its first `limit` characters) for the session's log."""
    with open(os.path.join(out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    text = json.dumps(summary, indent=1)
    print(text[:limit] if limit else text)
