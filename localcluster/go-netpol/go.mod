// pdwarden's build of kube-network-policies, the reference NetworkPolicy implementation
// (nftables rules divert the first packet of each connection of a pod a policy selects to an
// nfqueue, where the controller gives the verdict).
//
// A module of its own, like CoreDNS's: it requires nothing but the pinned release, so its
// dependencies resolve to the versions that release selects (client-go v0.32, not the control
// plane's), and changing it never rebuilds the control plane. `python -m
// pdwarden_localcluster.build` copies it outside the checkout, runs `go mod tidy` and builds
// cmd/pdwarden-network-policies twice: as is, and with _xtqueue/queue.go laid over the nftables
// library's queue expression (`go build -overlay`) for kernels without nftables' queue
// expression (see that file).
module pdwarden.io/localcluster/netpol

go 1.23.0

require sigs.k8s.io/kube-network-policies v0.8.0
