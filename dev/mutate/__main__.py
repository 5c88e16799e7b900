from __future__ import annotations

import sys

from dev.mutate.run import main

sys.exit(main())
