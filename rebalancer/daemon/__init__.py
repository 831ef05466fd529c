"""`rebalancer run`: the in-cluster service around `cycle.run_cycle`, and a live `rebalancer once`.

- `loop`: the schedule, one cycle, the stop flag between decisions (`Daemon`, `GatedEvictor`);
- `lease`: leader election on a Lease (`LeaseElector`);
- `reload`: policy hot reload by content hash (`PolicyWatcher`);
- `http`: `/metrics`, `/healthz`, `/readyz`, `/report` (`StatusServer`);
- `args`: the command-line options;
- `wiring`: the composition root (source, evictor, memory, elector, sinks, server from flags and
  policy) and `run_command` / `run_live_once`;
- `clock`: the one place the project reads the wall clock.

The daemon may use the core; the core never imports the daemon (an import-linter contract).
"""
