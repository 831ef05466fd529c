"""Built-in strategy plugins. Each module registers one pure strategy with `rebalancer.registry`.

Strategies read an immutable Snapshot and return proposals and findings; they never evict, query, or
read the clock.
"""
