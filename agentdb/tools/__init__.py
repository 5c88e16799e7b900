"""agentdb's tools: the CLI, the audit, the benchmark, the demo, the chaos runner.

Not public API: these modules may change in any release. The library (what
``from agentdb import ...`` and the worker and relay processes load) never
imports this package - ``make lint`` checks it (import-linter) - and tools
reach the database only through the library and its pool factory. Ad-hoc
SQL belongs here (demo, bench and admin statements), never in the library.
"""
