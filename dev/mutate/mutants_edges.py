"""Mutants of the edges of schedules (the catch-up cap exactly, a start on a tick, a
definition changed while firing) and of deadline rules in every non-final state."""

from __future__ import annotations

from dev.mutate.catalogue import Mutant

MUTANTS: tuple[Mutant, ...] = ()
