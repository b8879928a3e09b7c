"""Log-metrics exporter: follows job and kernel logs, exposes progress and error patterns."""
