"""Tooling that carries vLLM fork patches as queues on pinned upstream bases."""
