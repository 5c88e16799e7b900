"""The ``agentdb`` command's entry point, for the console script and ``python -m agentdb``.

Nothing is imported here at module level but ``sys``: a Ctrl-C in the first
instant of a command lands in this handler (one line, exit 130) rather than
in the middle of importing the CLI, where it would be a traceback. What is
left before the handler exists is the interpreter's own start-up, which
ends the process with the plain SIGINT status.
"""

from __future__ import annotations

import sys

__all__ = ["main"]


def main() -> None:
    """Run the command line and exit with its status."""
    try:
        from agentdb.tools.cli import main as run
    except KeyboardInterrupt:  # Ctrl-C while the command line is still being imported
        print("agentdb: interrupted", file=sys.stderr)
        sys.exit(130)
    sys.exit(run())
