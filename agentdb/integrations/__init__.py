"""Agent frameworks on agentdb: their model requests as steps, their tool calls as effects.

Each adapter is an optional extra, pinned to the framework release it is tested
against, and imports its framework only when imported itself:

* :mod:`agentdb.integrations.pydantic_ai` (``agentdb-pg[pydantic-ai]``): a
  durability capability for a Pydantic AI ``Agent``, as the framework's
  Temporal, DBOS and Prefect backends are.
* :mod:`agentdb.integrations.openai_agents` (``agentdb-pg[openai-agents]``): a
  drop-in for the OpenAI Agents SDK's ``Runner.run``, as ``DBOSRunner`` is.

Both run inside an agentdb task handler: the run's model requests are steps and
its tool calls effects of the running job (:func:`agentdb.worker.durable.running_job`),
so a worker killed anywhere re-enters the run from the top, replays what was
recorded, and calls each tool's provider once per call (G13, G25).
"""
