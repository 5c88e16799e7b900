"""``agentdb demo``: a multi-tenant agent workload, with crashes, and what came of it.

:mod:`~agentdb.tools.demo.provider` is the outside world the workers call (a
fake provider and consumer, with their own ledgers) and the handlers the
worker and relay processes run; :mod:`~agentdb.tools.demo.fleet` is those
processes and the supervisor that kills and replaces them;
:mod:`~agentdb.tools.demo.actors` is the reviewer, the canceller and the
schedules the driving process runs beside them;
:mod:`~agentdb.tools.demo.workload` seeds a run, drives it and counts what
happened from the database (:mod:`~agentdb.tools.demo.checks`: the counts of
the approvals, fan-outs, cancels and ticks); :mod:`~agentdb.tools.demo.limits` holds every
step of it to one deadline; :mod:`~agentdb.tools.demo.report` is the
command's run and report. Importing this package imports none of them.
"""
