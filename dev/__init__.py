"""Tools that work on a checkout of agentdb, not on an installation: not in the wheel.

``python -m dev.mutate`` (``make mutate``) edits scratch copies of the
checkout's files and runs its tests against them; ``python -m dev.schema_state``
(``make schema``) writes ``sql/schema.sql``. Both need ``sql/`` and ``tests/``
beside them, so an installed agentdb has no use for them.
"""
