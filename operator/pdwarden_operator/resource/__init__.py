"""The parts of the DisaggregatedModel resource as pydantic models, one module per part; the
resource itself (spec, status, the CRD's root rules) is `pdwarden_operator.models`, which the
CRD is generated from."""
