// pdwarden's prometheus-operator build, for the local cluster's monitoring stack
// (`pdwarden cluster up --monitoring`, pdwarden_localcluster/monitoring.py).
//
// `python -m pdwarden_localcluster.build` copies this module outside the checkout, runs
// `go mod tidy` and builds the operator and its config reloader, cached like the control
// plane. Prometheus and Alertmanager are built beside it from ../servers (their client-go is
// not this operator's).
module pdwarden.io/localcluster/monitoring/operator

go 1.25.0

require github.com/prometheus-operator/prometheus-operator v0.85.0

tool (
	github.com/prometheus-operator/prometheus-operator/cmd/operator
	github.com/prometheus-operator/prometheus-operator/cmd/prometheus-config-reloader
)
