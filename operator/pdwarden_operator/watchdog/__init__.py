"""The wedge watchdog: scrape every runtime pod's /metrics, decide who is wedged, act within a budget.

Pure modules decide (parse, rule, blame, ladder, outcome, brake, drain, state, ownership, targets);
`scrape` does HTTP within `budget`, `executor` performs Kubernetes actions through
`pdwarden_operator.kube`, `handlers` is the kopf wiring that runs each model's rounds.
"""
