"""gpu-rebalancer: a descheduler for GPU clusters.

`__version__` is the installed distribution's, whose one source is pyproject.toml's `version`. It is
looked up when first read (the package metadata costs a command ~25 ms at start, and only `--version`,
`version` and the daemon's build-info metric read it).
"""

from __future__ import annotations


def __getattr__(name: str) -> str:
    if name != "__version__":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from importlib.metadata import PackageNotFoundError, version

    try:
        found = version("gpu-rebalancer")
    except PackageNotFoundError:  # pragma: no cover - a source tree that was never installed
        found = "0+unknown"
    globals()["__version__"] = found
    return found
