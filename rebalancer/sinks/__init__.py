"""Sinks: the edges that publish a CycleReport (logs, metrics, Slack, webhooks, events)."""
