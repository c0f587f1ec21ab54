// pdwarden-etcd runs a single-member etcd embedded from go.etcd.io/etcd/server/v3/embed,
// listening on loopback only. It is the local cluster's datastore: durability is traded
// for speed (no fsync) because the data dir is disposable.
package main

import (
	"flag"
	"fmt"
	"net/url"
	"os"
	"os/signal"
	"syscall"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
)

func mustURL(raw string) url.URL {
	u, err := url.Parse(raw)
	if err != nil {
		fmt.Fprintf(os.Stderr, "pdwarden-etcd: bad URL %q: %v\n", raw, err)
		os.Exit(2)
	}
	return *u
}

func main() {
	dataDir := flag.String("data-dir", "", "etcd data directory (required)")
	clientURL := flag.String("listen-client-url", "http://127.0.0.1:36379", "client URL")
	peerURL := flag.String("listen-peer-url", "http://127.0.0.1:36380", "peer URL")
	name := flag.String("name", "pdwarden", "member name")
	flag.Parse()
	if *dataDir == "" {
		fmt.Fprintln(os.Stderr, "pdwarden-etcd: --data-dir is required")
		os.Exit(2)
	}

	cfg := embed.NewConfig()
	cfg.Name = *name
	cfg.Dir = *dataDir
	client, peer := mustURL(*clientURL), mustURL(*peerURL)
	cfg.ListenClientUrls = []url.URL{client}
	cfg.AdvertiseClientUrls = []url.URL{client}
	cfg.ListenPeerUrls = []url.URL{peer}
	cfg.AdvertisePeerUrls = []url.URL{peer}
	cfg.InitialCluster = fmt.Sprintf("%s=%s", *name, peer.String())
	cfg.UnsafeNoFsync = true
	cfg.LogLevel = "warn"
	cfg.AutoCompactionMode = "periodic"
	cfg.AutoCompactionRetention = "5m"

	e, err := embed.StartEtcd(cfg)
	if err != nil {
		fmt.Fprintf(os.Stderr, "pdwarden-etcd: cannot start: %v\n", err)
		os.Exit(1)
	}
	select {
	case <-e.Server.ReadyNotify():
		fmt.Fprintf(os.Stderr, "pdwarden-etcd: ready on %s\n", client.String())
	case <-time.After(60 * time.Second):
		e.Server.Stop()
		fmt.Fprintln(os.Stderr, "pdwarden-etcd: not ready after 60s")
		os.Exit(1)
	}

	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	select {
	case <-sig:
		e.Close()
	case err := <-e.Err():
		fmt.Fprintf(os.Stderr, "pdwarden-etcd: %v\n", err)
		e.Close()
		os.Exit(1)
	}
}
