from __future__ import annotations

import sys

from agentdb.tools.cli import main

sys.exit(main())
