"""The wedge watchdog: scrape every runtime pod's /metrics, decide who is wedged, act within a budget.

Pure modules decide (parse, rule, blame, group_health, ladder, outcome, brake, drain, state, ownership,
targets, autoscale), over the shared types of `verdict`; `scrape` does HTTP within `budget`,
`executor` performs Kubernetes actions through `pdwarden_operator.kube`, `scaler` writes the
autoscaled counts, `role_load` keeps each role's load for the external metrics API, and
`model_watchdog` runs one model's rounds and `kopf_handlers` keeps one such task per model.
"""
