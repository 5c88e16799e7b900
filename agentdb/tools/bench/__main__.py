"""``python -m agentdb.tools.bench``: the same as ``agentdb bench``."""

from __future__ import annotations

import sys

from agentdb.tools.bench.command import main

sys.exit(main())
