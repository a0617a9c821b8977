"""The engine: one threaded, bounded loader with its knobs, budgets, checkpoints, stats and timeline."""
