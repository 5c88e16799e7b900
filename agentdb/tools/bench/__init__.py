"""``agentdb bench``: agentdb side by side with raw asyncpg, PgQueuer and Procrastinate.

Five comparisons, each run with its contenders interleaved in the same
process and on the same server (A B A B ..., ``--reps`` repetitions; medians
with min-max), so noisy neighbours hit every contender alike:

1. **Statement overhead** - agentdb's helpers (transition + event, reserve,
   claim, complete) against ``conn.fetch`` of the very same SQL text and
   arguments, on the same number of connections (:mod:`.statements`).
2. **Task cycle** - claim under a lease, reserve and complete an operation,
   finish the task with its event and an outbox row (which drops the lease),
   with 1 and 4 workers: agentdb one statement per step, agentdb batched
   (``reserve_many`` / ``operations.complete_many`` / ``tasks.finish_many``),
   PgQueuer (default and tuned batch) and Procrastinate no-op jobs
   (:mod:`.cycle`, :mod:`.peers`).
3. **Outbox relay** - :class:`agentdb.relay.Relay` and the outbox helpers
   against raw SKIP LOCKED drains (:mod:`.relay`).
4. **Scaling** - claim latency (p50 / p99) with a small and a large task
   table, and the claim's plan (:mod:`.scaling`).
5. **Pickup latency** - a real idle :class:`agentdb.worker.Worker`, from a
   task's creation to its handler, with LISTEN and with polling alone
   (:mod:`.pickup`).

It creates its own databases (``agentdb_bench_<hex>``, ``pgqueuer_bench_<hex>``,
``procrastinate_bench_<hex>``), drops them at the end, and writes
``report.md``, ``results.json`` and ``chart.png`` (:mod:`.report`), with
every measured figure against its goal (:mod:`.targets`). It is a
benchmark, not a test: it reports what it measures and asserts no speed.
:mod:`.runner` runs it all, :mod:`.harness` holds what the comparisons share,
:mod:`.command` is the command line.

    python -m agentdb.tools.bench --quick                      # embedded Postgres, < 1 minute
    agentdb bench --dsn postgresql://postgres@host/postgres --out bench-results
"""
