"""Mutants of what a holder may do after taking a task over from an expired lease (a
reclaim, not a first claim), and of a finishing write whose answer was lost on the
task's last attempt or while another worker moved the task."""

from __future__ import annotations

from dev.mutate.catalogue import Mutant

MUTANTS: tuple[Mutant, ...] = ()
