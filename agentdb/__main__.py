from __future__ import annotations

import sys

try:
    from agentdb.tools._entry import main
except KeyboardInterrupt:  # Ctrl-C in the first instant, before the entry's own handler
    print("agentdb: interrupted", file=sys.stderr)
    sys.exit(130)

main()
