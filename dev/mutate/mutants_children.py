"""Mutants of child tasks and the parent waiting on them (G22 and its deadlines): a child
that ends other than by success, a parent whose deadline passes while it waits, a child
made while its parent finishes - the classes issue 35 found no test exercised."""

from __future__ import annotations

from dev.mutate.catalogue import Mutant

MUTANTS: tuple[Mutant, ...] = ()
