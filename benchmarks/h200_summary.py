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


def pytest_shards(out: str) -> dict:
    """The sharded GPU tests of a check (OUT/pytest_<i>.xml / .log, the ids in OUT/test_ids.txt): `pytest`, the
    junit counts summed (tests / failures / errors / skipped) and `collected` (0: collection failed); `pytest_failed`,
    the first 20 failed or erroring test names (an unreadable xml counts as one, named with its error); `pytest_tails`,
    the last 2 lines of each shard's log."""
    import glob
    import xml.etree.ElementTree as ET

    counts, failed = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}, []
    for f in sorted(glob.glob(os.path.join(out, "pytest_*.xml"))):
        try:
            for suite in ET.parse(f).getroot().iter("testsuite"):
                for k in counts:
                    counts[k] += int(suite.get(k, 0))
                for case in suite.iter("testcase"):
                    if case.find("failure") is not None or case.find("error") is not None:
                        failed.append(case.get("name"))
        except Exception as e:   # noqa: BLE001 - a cut or corrupt shard is reported, not fatal to the summary
            failed.append(f"{f}: {e!r}")
    ids = os.path.join(out, "test_ids.txt")
    counts["collected"] = len(open(ids).read().split()) if os.path.exists(ids) else 0
    return {"pytest": counts, "pytest_failed": failed[:20],
            "pytest_tails": {os.path.basename(f): tail(out, os.path.basename(f), 2)
                             for f in sorted(glob.glob(os.path.join(out, "pytest_*.log")))}}


def junit(path: str) -> dict | None:
    """One pytest junit xml's counts (tests / failures / errors / skipped) summed over its suites; None where it is
    missing or unreadable (a process cut before it wrote it)."""
    import xml.etree.ElementTree as ET

    if not os.path.exists(path):
        return None
    try:
        counts = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
        for suite in ET.parse(path).getroot().iter("testsuite"):
            for k in counts:
                counts[k] += int(suite.get(k, 0))
        return counts
    except Exception:   # noqa: BLE001 - reported as missing, never fatal to the summary
        return None


def passed(rc: int | None, counts: dict | None, expected: int) -> bool:
    """A pytest run passed: rc 0 and its junit counts `expected` tests, none failed, erroring or skipped (a skip is
    a GPU test that did not run: no GPU, the wrong Triton)."""
    return rc == 0 and counts is not None and counts["tests"] == expected and \
        counts["failures"] == counts["errors"] == counts["skipped"] == 0
