"""`python -m trace_rl ...` is `trace-rl ...`."""

import sys

from trace_rl.cli import main

sys.exit(main())
