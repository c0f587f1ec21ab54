// pdwarden's CoreDNS build: the local cluster's DNS server (cluster.local from the API server).
//
// A module of its own because CoreDNS needs a newer Go and client-go than the pinned
// kubernetes module. `python -m pdwarden_localcluster.build` copies it outside the checkout,
// runs `go mod tidy` and builds cmd/pdwarden-coredns, cached like the control plane.
module pdwarden.io/localcluster/coredns

go 1.26.0

require github.com/coredns/coredns v1.15.0
