"""The wedge watchdog: scrape every runtime pod's /metrics, decide who is wedged, act within a budget.

Pure modules decide (parse, rule, ladder, state, settings); `scrape` does HTTP, `executor` performs
Kubernetes actions through `pdwarden_operator.kube`, `handlers` is the thin kopf daemon tying them.
"""
