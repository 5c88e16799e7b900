from __future__ import annotations

import sys

try:
    from agentdb.tools.cli import main
except KeyboardInterrupt:  # Ctrl-C while the command line is still being imported
    print("agentdb: interrupted", file=sys.stderr)
    sys.exit(130)

sys.exit(main())
