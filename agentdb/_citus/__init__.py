"""The Citus path, in a room of its own (see README "Scaling out with Citus").

On a schema ``agentdb migrate --citus`` distributed by tenant, the runtime
runs per-tenant statements that Citus routes whole to one worker, so one
task's work commits there without two-phase commit; everywhere else it runs
its one-statement forms. The difference lives here:

* :mod:`agentdb._citus.routing` - whether a pool's (a connection's) schema is
  distributed, asked once per pool or connection, and :func:`~agentdb._citus.routing.twin`,
  the one place a single-node form gives way to its routed twin;
* :mod:`agentdb._citus.routed` - the routed forms, and ``queries/routed.sql``
  their statements (``tests/test_routed_twins.py`` holds each against its
  single-node twin: the same result columns, the same guards);
* :mod:`agentdb._citus.migrate` - what ``agentdb migrate`` does differently on
  a Citus coordinator (the distribution itself is SQL: ``agentdb_distribute()``,
  sql/migrations/0012.citus.sql).
"""
