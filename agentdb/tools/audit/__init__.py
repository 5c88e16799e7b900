"""``agentdb audit``: which guarantees an existing schema enforces (read-only)."""
