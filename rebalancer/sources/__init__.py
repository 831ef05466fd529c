"""Sources: the edges that read the world (snapshot directories, the cluster, Prometheus) into a Snapshot."""
