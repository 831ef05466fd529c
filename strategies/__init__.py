"""Built-in strategy plugins. Each strategy module registers one pure strategy with `rebalancer.registry`.

A strategy too long to hold in one's head keeps its arguments and its `@strategy` entry point in
`<name>.py` (the module the registry loads) and its parts, by concern, in `<name>_<part>.py` beside it.

Strategies read an immutable Snapshot and return proposals and findings; they never evict, query, or
read the clock.
"""
