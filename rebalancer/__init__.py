"""gpu-rebalancer: a descheduler for GPU clusters."""

__version__ = "0.1.0"
