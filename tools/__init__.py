"""t1 tooling: `t1-replay` (tools.replay), `t1-audit` (tools.audit), run reports (tools.report.write_report)."""
