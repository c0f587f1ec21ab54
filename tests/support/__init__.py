"""Harnesses the tests share: the watchdog e2e scenarios' cluster access and load
(`watchdog_env`), a runtime's metrics on a fake clock (`runtime_metrics`), a scenario
child's last JSON line (`child_result`)."""
