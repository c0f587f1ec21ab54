// pdwarden-network-policies runs kube-network-policies' NetworkPolicy controller (its
// pkg/networkpolicy, unchanged) for the local cluster, inside the cluster's gateway network
// namespace, where every node's bridge is and so all pod traffic is forwarded.
//
// It follows kube-network-policies' own cmd/main.go at the pinned release, except:
//   - a kubeconfig instead of the in-cluster config: it is a process of the cluster, not a pod;
//   - one controller per --node, each with its own nftables table and queue number: a controller
//     diverts only the traffic of its own node's pods (as one per node does on a cluster), and
//     all nodes share this namespace. Traffic between two nodes' pods is judged by both, as on
//     a cluster;
//   - NRI stays on as in that command (its --disable-nri is never applied there, and the
//     controller needs the plugin); no runtime serves it here, so it only logs that;
//   - no AdminNetworkPolicy flags (alpha there, off by default);
//   - a controller that stops with an error stops the process (exit 1), so the cluster sees it;
//   - --check-queue: load one queue rule into a scratch table and exit, to learn whether the
//     kernel accepts this build's queue expression.
package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"golang.org/x/sys/unix"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/component-base/logs"
	logsapi "k8s.io/component-base/logs/api/v1"
	_ "k8s.io/component-base/logs/json/register"
	"k8s.io/klog/v2"
	"sigs.k8s.io/kube-network-policies/pkg/networkpolicy"
)

// Set with -ldflags -X by the build that lays _xtqueue/queue.go over the nftables library.
var queueEncoding = "nftables queue expression"

type nodeList []string

func (n *nodeList) String() string { return strings.Join(*n, ",") }
func (n *nodeList) Set(v string) error {
	if v == "" {
		return fmt.Errorf("empty node name")
	}
	*n = append(*n, v)
	return nil
}

var (
	kubeconfig          string
	nodes               nodeList
	failOpen            bool
	queueID             int
	metricsBindAddress  string
	netfilterBug1766Fix bool
	checkQueue          bool
)

func init() {
	flag.StringVar(&kubeconfig, "kubeconfig", "", "kubeconfig of the controller's identity (required)")
	flag.Var(&nodes, "node", "a Node whose pods' traffic this process judges (repeat for each node)")
	flag.BoolVar(&failOpen, "fail-open", false, "If set, don't drop packets if the controller is not running")
	flag.IntVar(&queueID, "nfqueue-id", 100, "Number of the nfqueue of the first --node; the i-th uses this + i")
	flag.StringVar(&metricsBindAddress, "metrics-bind-address", ":9080", "The IP address and port for the metrics server to serve on")
	flag.BoolVar(&netfilterBug1766Fix, "netfilter-bug-1766-fix", true, "If set, process DNS packets on the PREROUTING hooks to avoid the race condition on the conntrack subsystem, not needed for kernels 6.12+ (see https://bugzilla.netfilter.org/show_bug.cgi?id=1766)")
	flag.BoolVar(&checkQueue, "check-queue", false, "Load one queue rule into a scratch table in this network namespace, remove it, and exit 0 if the kernel took it")
	flag.Usage = func() {
		fmt.Fprint(os.Stderr, "Usage: pdwarden-network-policies --kubeconfig=FILE --node=NAME... [options]\n\n")
		flag.PrintDefaults()
	}
}

func main() {
	os.Exit(run())
}

func run() int {
	c := logsapi.NewLoggingConfiguration()
	logsapi.AddGoFlags(c, flag.CommandLine)
	flag.Parse()
	logs.InitLogs()
	if err := logsapi.ValidateAndApply(c, nil); err != nil {
		fmt.Fprintf(os.Stderr, "%v\n", err)
		return 1
	}
	if checkQueue {
		return checkQueueRule()
	}
	if kubeconfig == "" || len(nodes) == 0 {
		flag.Usage()
		return 2
	}

	// Create a context for structured logging, and catch termination signals (as upstream:
	// SIGTERM ends the process without removing its tables, so traffic stays judged fail-closed
	// until the next instance replaces them)
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, unix.SIGINT)
	defer cancel()

	logger := klog.FromContext(ctx)
	logger.Info("called", "args", flag.Args(), "queueEncoding", queueEncoding)
	flag.VisitAll(func(flag *flag.Flag) {
		logger.Info("flag", "name", flag.Name, "value", flag.Value)
	})

	if _, _, err := net.SplitHostPort(metricsBindAddress); err != nil {
		logger.Error(err, "parsing metrics bind address", "address", metricsBindAddress)
		return 1
	}

	config, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		logger.Error(err, "reading the kubeconfig", "path", kubeconfig)
		return 1
	}
	// use protobuf for better performance at scale
	config.AcceptContentTypes = "application/vnd.kubernetes.protobuf,application/json"
	config.ContentType = "application/vnd.kubernetes.protobuf"
	clientset, err := kubernetes.NewForConfig(config)
	if err != nil {
		logger.Error(err, "creating the clientset")
		return 1
	}

	http.Handle("/metrics", promhttp.Handler())
	go func() {
		err := http.ListenAndServe(metricsBindAddress, nil)
		utilruntime.HandleError(err)
	}()

	stopped := make(chan error, len(nodes))
	for i, node := range nodes {
		// an informer factory each: every controller adds its own pod index
		informersFactory := informers.NewSharedInformerFactory(clientset, 0)
		cfg := networkpolicy.Config{
			FailOpen:            failOpen,
			QueueID:             queueID + i,
			NodeName:            node,
			NetfilterBug1766Fix: netfilterBug1766Fix,
			NFTableName:         "kube-network-policies-" + node,
		}
		controller, err := networkpolicy.NewController(
			clientset,
			informersFactory.Networking().V1().NetworkPolicies(),
			informersFactory.Core().V1().Namespaces(),
			informersFactory.Core().V1().Pods(),
			nil, nil, nil, nil,
			cfg,
		)
		if err != nil {
			logger.Error(err, "Can not start network policy controller", "node", node)
			return 1
		}
		go func() {
			stopped <- controller.Run(ctx)
		}()
		informersFactory.Start(ctx.Done())
		logger.Info("controller started", "node", node, "table", cfg.NFTableName, "queue", cfg.QueueID)
	}

	select {
	case <-ctx.Done():
	case err := <-stopped:
		if ctx.Err() == nil {
			logger.Error(err, "a network policy controller stopped; exiting")
			return 1
		}
	}
	// grace period to cleanup resources
	time.Sleep(5 * time.Second)
	return 0
}

// checkQueueRule loads `queue num <id> bypass` (bypass: a packet it met with no listener
// would pass) into a table of its own and deletes the table again.
func checkQueueRule() int {
	nft, err := nftables.New()
	if err != nil {
		fmt.Fprintf(os.Stderr, "nftables: %v\n", err)
		return 1
	}
	table := &nftables.Table{Name: "pdwarden-queue-check", Family: nftables.TableFamilyINet}
	nft.AddTable(table)
	nft.DelTable(table)
	nft.AddTable(table)
	chain := nft.AddChain(&nftables.Chain{
		Name:     "postrouting",
		Table:    table,
		Type:     nftables.ChainTypeFilter,
		Hooknum:  nftables.ChainHookPostrouting,
		Priority: nftables.ChainPriorityRef(*nftables.ChainPriorityNATSource - 5),
	})
	nft.AddRule(&nftables.Rule{
		Table: table,
		Chain: chain,
		Exprs: []expr.Any{&expr.Queue{Num: uint16(queueID), Flag: expr.QueueFlagBypass}},
	})
	loaded := nft.Flush()
	nft.DelTable(table)
	if err := nft.Flush(); err != nil && loaded == nil {
		fmt.Fprintf(os.Stderr, "removing the scratch table: %v\n", err)
		return 1
	}
	if loaded != nil {
		fmt.Fprintf(os.Stderr, "the kernel refused a queue rule sent as the %s: %v\n", queueEncoding, loaded)
		return 1
	}
	fmt.Printf("the kernel took a queue rule sent as the %s\n", queueEncoding)
	return 0
}
