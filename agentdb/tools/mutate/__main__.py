from __future__ import annotations

import sys

from agentdb.tools.mutate.run import main

sys.exit(main())
