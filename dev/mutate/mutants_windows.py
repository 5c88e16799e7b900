"""Mutants of the races and windows the suite never ran: the global rate limit under
concurrent reservers, a budget window that rolls over through a settlement, a claim
batch that is not a multiple of the tenants with due work.

The rate limit's race needs no mutant here: the generated ones that drop the FOR UPDATE
of agentdb_count_call (gen-0009.budgets-agentdb_count_call-lock-1, the tenant's limit,
and -lock-2, the global one) are killed by
tests/test_budgets.py::test_G19_two_reservers_racing_for_the_last_call_of_a_rate_limit.
"""

from __future__ import annotations

from dev.mutate.catalogue import LEASES_SQL, MIGRATIONS, Mutant, T, m

ROLLOVER = (
    T + "test_budgets.py::"
    "test_G19_a_hold_settled_after_its_window_rolled_over_is_charged_to_the_new_window"
)
UNEVEN_BATCH = (
    T + "test_fairness.py::test_G18_a_batch_not_a_multiple_of_the_tenants_is_filled_and_shared"
)
ROUTED = "agentdb/_citus/routed.py"

MUTANTS: tuple[Mutant, ...] = (
    m(
        "windows-rollover-drops-the-settlement",
        MIGRATIONS,
        "        NEW.spent := NEW.spent - OLD.spent;",
        "        NEW.spent := 0;",
        ROLLOVER,
        "agentdb_guard_budget: a window's first write resets spent to 0 even when it spends "
        "(a hold settled after the rollover): the settled cost is never charged",
        within="agentdb_guard_budget",
    ),
    m(
        "windows-rollover-keeps-the-old-spend",
        MIGRATIONS,
        "        NEW.spent := NEW.spent - OLD.spent;",
        "        NEW.spent := NEW.spent;",
        ROLLOVER,
        "agentdb_guard_budget: a settlement that rolls the window over keeps the old "
        "window's spend: yesterday's spend is charged again today",
        within="agentdb_guard_budget",
    ),
    m(
        "windows-claim-share-rounds-down",
        LEASES_SQL,
        "(SELECT ($2 + count(*) - 1) / count(*) FROM due)",
        "(SELECT $2 / count(*) FROM due)",
        UNEVEN_BATCH,
        "lease_claim: a tenant's share is floor(batch / tenants): a batch of 4 over 3 "
        "tenants comes back with 3 while due work waits",
        within="lease_claim",
    ),
    m(
        "windows-claim-takes-a-tenant-whole-first",
        LEASES_SQL,
        "row_number() OVER (ORDER BY r.nth, r.step)",
        "row_number() OVER (ORDER BY r.step, r.nth)",
        UNEVEN_BATCH,
        "lease_claim: the batch takes each tenant's whole share in walk order: the last "
        "tenant of an uneven batch gets nothing",
        within="lease_claim",
    ),
    m(
        "windows-claim-batch-unbounded",
        LEASES_SQL,
        "    ORDER BY ord\n    LIMIT $2\n), claimed AS (",
        "    ORDER BY ord\n), claimed AS (",
        UNEVEN_BATCH,
        "lease_claim: the pick is not cut to the batch: the rounded-up shares claim more "
        "tasks than the worker asked for",
        within="lease_claim",
    ),
    # The Citus claim's walk is Python over per-tenant claims; it runs on plain Postgres
    # too, so these are tested here (the same test, its ``routed`` cases).
    m(
        "windows-routed-claim-takes-a-tenant-whole-first",
        ROUTED,
        "            want = min(base + 1 if i < extra else base, batch - len(out))",
        "            want = min(base + 1 if extra else base, batch - len(out))",
        UNEVEN_BATCH,
        "routed claim (Citus): every tenant asks for ceil(batch / tenants) in the walk's "
        "order: the last tenant of an uneven batch gets nothing",
        within="_claim_walk",
    ),
    m(
        "windows-routed-claim-rows-tenant-by-tenant",
        ROUTED,
        "    return _as_taken(out)",
        "    return out",
        UNEVEN_BATCH,
        "routed claim (Citus): rows come back tenant by tenant, so the next walk starts "
        "after the tenant with the short share every time: the extra tasks never rotate",
        within="_claim_walk",
    ),
)
