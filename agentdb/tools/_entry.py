"""The ``agentdb`` command's entry point, for the console script and ``python -m agentdb``.

Nothing is imported here at module level but ``sys``: a Ctrl-C in the first
instant of a command is held until the CLI is imported, then ends it with
one line (exit 130) - never a traceback from the middle of an import, nor an
interrupt Python swallowed there. What is left before the hold begins is the
interpreter's own start-up, which ends the process with the plain SIGINT
status.
"""

from __future__ import annotations

import sys

__all__ = ["main"]


def main() -> None:
    """Run the command line and exit with its status."""
    # Ctrl-C while the command line is imported is held and acted on after the
    # import: raised in the middle of it, it can land where Python swallows
    # exceptions (a weakref callback of the import lock says "Exception
    # ignored" and goes on), and the command would then run as if never stopped.
    # Even ``import signal`` is inside the try: on a loaded box the interrupt
    # has landed there, before any hold could begin (seen in CI, at 0.05 s).
    came: list[bool] = []
    held = False
    try:
        import signal

        held = signal.getsignal(signal.SIGINT) is signal.default_int_handler
        if held:
            signal.signal(signal.SIGINT, lambda signum, frame: came.append(True))
        from agentdb.tools.cli import main as run
    except KeyboardInterrupt:  # Ctrl-C before the hold began
        came.append(True)
    finally:
        if held:
            signal.signal(signal.SIGINT, signal.default_int_handler)
    if came:
        print("agentdb: interrupted", file=sys.stderr)
        sys.exit(130)
    sys.exit(run())
