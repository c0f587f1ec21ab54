"""Reconcile one DisaggregatedModel in a straight line (`run.reconcile`): observe -> plan ->
execute -> one status write, one module per stage:

- `observe.py`: the spec validated and allowed by the pod policy, the owner as its children see
  it (who uses its worker key), what the status writer remembers -> a frozen `Observation`
  (`observation.py`);
- `planner.py` (pure, nothing from `pdwarden_operator.kube`): render and compare with the
  children the operator's watches hold -> a `PassPlan` (what to apply, what the spec dropped);
- `executor.py`: every API write of a pass, in waves, nothing half-applied on a refusal;
- `report.py`: the status, written only when it changed (or the refusal, for a refused pass);
- `errors.py`: what a pass raises (`Refused`, `RetryLater`, `InvalidSpec`).

This file imports nothing, so that importing the planner loads no stage that calls the API.
"""
