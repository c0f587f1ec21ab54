// pdwarden's Go tools module: the embedded local cluster's control plane.
//
// Only the pin lives here. `python -m pdwarden_localcluster.build` copies this module to a
// build directory outside the checkout, appends one `replace k8s.io/X => k8s.io/X v0.N.P`
// per staging module listed in the go.mod that the module proxy serves for the pinned
// k8s.io/kubernetes (generated, never hand-kept), runs `go mod tidy`, and builds
// kube-apiserver, kube-controller-manager, kube-scheduler, kube-proxy, pdwarden-etcd (embedded
// etcd at the version the kubernetes module selects) and pdwarden-streaming (the process
// kubelet's exec and port-forward endpoints, on the kubelet's own streaming library).
module pdwarden.io/localcluster

go 1.25.0

require k8s.io/kubernetes v1.35.4

// The cluster commands built from the pinned kubernetes module (the `tool` directive
// keeps their dependencies in go.mod/go.sum through `go mod tidy`).
tool (
	k8s.io/kubernetes/cmd/kube-apiserver
	k8s.io/kubernetes/cmd/kube-controller-manager
	k8s.io/kubernetes/cmd/kube-scheduler
	k8s.io/kubernetes/cmd/kube-proxy
)
