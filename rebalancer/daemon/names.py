"""The default names of the objects the daemon keeps in the cluster: its Lease and its state ConfigMap.

Owns only these names, so that the command line shows them as defaults without importing the modules
that read and write those objects (rebalancer.daemon.lease, rebalancer.state) and with them the
Kubernetes client. It must not import anything.
"""

from __future__ import annotations

__all__ = ["DEFAULT_LEASE_NAME", "STATE_CONFIGMAP"]

DEFAULT_LEASE_NAME = "gpu-rebalancer"
STATE_CONFIGMAP = "gpu-rebalancer-state"
