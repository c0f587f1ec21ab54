"""Harnesses the tests share: a runtime's metrics on a fake clock (`runtime_metrics`), a
scenario child's last JSON line (`child_result`), the in-process transfer scenarios on SGLang's
NIXL classes (`transfer_scenarios`), an API client no unit test reaches (`kube_client`). The
watchdog e2e scenarios' cluster access and load live in pdwarden_testkit.cluster_env, which the
remediation benchmark shares."""
