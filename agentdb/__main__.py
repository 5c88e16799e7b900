from __future__ import annotations

import sys

from agentdb.cli import main

sys.exit(main())
