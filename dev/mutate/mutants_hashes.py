"""Mutants of the idempotency hashes - every field a dedupe or definition hash must
cover, not only the payload - and of the errors the library documents at its boundary."""

from __future__ import annotations

from dev.mutate.catalogue import Mutant

MUTANTS: tuple[Mutant, ...] = ()
