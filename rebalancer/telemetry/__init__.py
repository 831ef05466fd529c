"""GPU telemetry from NVIDIA's dcgm-exporter, independent of where it is read from.

- `exposition`: Prometheus text format and OpenMetrics, read and written (`exposition_documents`: the
  lines cut into documents, the plain ones read on the way; `exposition_lines`: what one line, or a
  piece of it, reads as; `series`: what reading yields);
- `identity`: which GPU, MIG instance and pod a series is about; presets; valid values;
- `windows`: series (raw samples or Prometheus' aggregates) -> per-window rows of `model.Telemetry`.

The package is pure: no I/O, no clock. The sources (`sources.files`, `sources.prometheus`) read.
"""
