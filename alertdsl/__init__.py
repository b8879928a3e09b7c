"""The alert-condition language: `alertmanager/alerts.yaml` parsed and validated (`spec`),
compiled to Prometheus rules (`rules`) and promtool tests (`promtool`), and evaluated
in-process over recorded frames (`evaluation`). It reads the catalogue (the XIDs and patterns
an alert names) and nothing else of Goodput's."""
