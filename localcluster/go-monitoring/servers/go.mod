// pdwarden's Prometheus and Alertmanager build, for the local cluster's monitoring stack
// (`pdwarden cluster up --monitoring`, pdwarden_localcluster/monitoring.py).
//
// The versions prometheus-operator in ../operator runs by default: Prometheus v3.5.0 (its
// module is tagged v0.305.0) and Alertmanager v0.28.1. The image tags the local kubelet
// accepts follow these pins (kubelet/images.py), and the build refuses a `go mod tidy` that
// moves one.
module pdwarden.io/localcluster/monitoring/servers

go 1.25.0

require (
	github.com/prometheus/alertmanager v0.28.1
	github.com/prometheus/prometheus v0.305.0
)

tool (
	github.com/prometheus/alertmanager/cmd/alertmanager
	github.com/prometheus/prometheus/cmd/prometheus
)
