"""``agentdb console``: the operator's web console (Starlette, served by uvicorn)."""
