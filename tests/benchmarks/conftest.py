"""benchmarks/ and scripts/ are folders of scripts, not packages: their tests import them by path (appended to
sys.path, so a script named like a package, e.g. benchmarks/distributed.py, never shadows it)."""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
for folder in (ROOT / "benchmarks", ROOT / "scripts"):
    if str(folder) not in sys.path:
        sys.path.append(str(folder))
