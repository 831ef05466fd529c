"""gpu-rebalancer: a descheduler for GPU clusters.

`__version__` is the installed distribution's, whose one source is pyproject.toml's `version`.
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("gpu-rebalancer")
except PackageNotFoundError:  # pragma: no cover - a source tree that was never installed
    __version__ = "0+unknown"
