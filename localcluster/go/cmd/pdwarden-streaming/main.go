// pdwarden-streaming serves the kubelet's streaming endpoints for the process kubelet:
// `kubectl exec` and `kubectl port-forward` (the API server speaks SPDY or WebSocket to the
// kubelet; the protocol handling is the kubelet's own library, k8s.io/kubelet/pkg/cri/streaming).
//
// The Python kubelet's HTTPS endpoint relays /exec/, /attach/ and /portForward/ requests here
// (plain HTTP on loopback). A pod's network namespace, address, and each container's
// environment and working directory come from `<pods-dir>/<namespace>_<pod>_<uid>/exec.json`,
// written by the pod's worker. Exec runs the command through `ip netns exec` in the pod's
// namespace with the container's environment; port-forward dials the pod's address.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"k8s.io/apimachinery/pkg/types"
	remotecommandconsts "k8s.io/apimachinery/pkg/util/remotecommand"
	"k8s.io/client-go/tools/remotecommand"
	"k8s.io/kubelet/pkg/cri/streaming/portforward"
	remotecommandserver "k8s.io/kubelet/pkg/cri/streaming/remotecommand"
	utilexec "k8s.io/utils/exec"
)

type containerInfo struct {
	Env map[string]string `json:"env"`
	Cwd string            `json:"cwd"`
}

type podInfo struct {
	Netns      string                   `json:"netns"`
	IP         string                   `json:"ip"`
	Containers map[string]containerInfo `json:"containers"`
	Order      []string                 `json:"order"`
}

type runtime struct {
	podsDir string
	ipBin   string
}

// lookup reads the newest exec.json of namespace/pod (a re-created pod of the same name has a
// newer directory).
func (r *runtime) lookup(namespace, pod string) (*podInfo, error) {
	matches, _ := filepath.Glob(filepath.Join(r.podsDir, namespace+"_"+pod+"_*", "exec.json"))
	if len(matches) == 0 {
		return nil, fmt.Errorf("pod %s/%s is not running on this kubelet", namespace, pod)
	}
	sort.Slice(matches, func(i, j int) bool {
		a, _ := os.Stat(matches[i])
		b, _ := os.Stat(matches[j])
		return a != nil && b != nil && a.ModTime().After(b.ModTime())
	})
	data, err := os.ReadFile(matches[0])
	if err != nil {
		return nil, err
	}
	var info podInfo
	if err := json.Unmarshal(data, &info); err != nil {
		return nil, fmt.Errorf("%s: %w", matches[0], err)
	}
	return &info, nil
}

// podName is "<namespace>/<pod>" (the handlers pass it through unchanged).
func splitName(name string) (string, string) {
	ns, pod, _ := strings.Cut(name, "/")
	return ns, pod
}

func (r *runtime) ExecInContainer(ctx context.Context, name string, _ types.UID, container string, cmd []string,
	in io.Reader, out, errw io.WriteCloser, _ bool, _ <-chan remotecommand.TerminalSize, _ time.Duration) error {
	ns, pod := splitName(name)
	info, err := r.lookup(ns, pod)
	if err != nil {
		return err
	}
	if container == "" && len(info.Order) > 0 {
		container = info.Order[0]
	}
	c, ok := info.Containers[container]
	if !ok {
		return fmt.Errorf("container %q is not running in pod %s/%s", container, ns, pod)
	}
	if len(cmd) == 0 {
		return errors.New("no command given")
	}
	argv := cmd
	if info.Netns != "" {
		argv = append([]string{r.ipBin, "netns", "exec", info.Netns}, cmd...)
	}
	proc := exec.CommandContext(ctx, argv[0], argv[1:]...)
	env := make([]string, 0, len(c.Env))
	for k, v := range c.Env {
		env = append(env, k+"="+v)
	}
	proc.Env = env
	proc.Dir = c.Cwd
	proc.Stdin, proc.Stdout, proc.Stderr = in, out, errw
	if info.Netns == "" { // resolve on the container's PATH, as ip netns exec does inside
		if path, lookErr := lookPath(cmd[0], c.Env["PATH"]); lookErr == nil {
			proc.Path = path
		}
	}
	err = proc.Run()
	var exitErr *exec.ExitError
	if errors.As(err, &exitErr) {
		return &utilexec.ExitErrorWrapper{ExitError: exitErr}
	}
	return err
}

func lookPath(name, path string) (string, error) {
	if strings.Contains(name, "/") {
		return name, nil
	}
	for _, dir := range filepath.SplitList(path) {
		candidate := filepath.Join(dir, name)
		if st, err := os.Stat(candidate); err == nil && !st.IsDir() && st.Mode()&0o111 != 0 {
			return candidate, nil
		}
	}
	return "", fmt.Errorf("%s: not found on PATH", name)
}

func (r *runtime) PortForward(ctx context.Context, name string, _ types.UID, port int32, stream io.ReadWriteCloser) error {
	defer stream.Close()
	ns, pod := splitName(name)
	info, err := r.lookup(ns, pod)
	if err != nil {
		return err
	}
	host := info.IP
	if host == "" {
		host = "127.0.0.1"
	}
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", net.JoinHostPort(host, strconv.Itoa(int(port))))
	if err != nil {
		return fmt.Errorf("pod %s/%s port %d: %w", ns, pod, port, err)
	}
	defer conn.Close()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		_, _ = io.Copy(conn, stream)
		if tcp, ok := conn.(*net.TCPConn); ok {
			_ = tcp.CloseWrite()
		}
	}()
	_, _ = io.Copy(stream, conn)
	wg.Wait()
	return nil
}

const idleTimeout = 4 * time.Hour

func (r *runtime) serveExec(w http.ResponseWriter, req *http.Request, ns, pod, container string) {
	opts, err := remotecommandserver.NewOptions(req)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	cmd := req.URL.Query()["command"]
	remotecommandserver.ServeExec(w, req, r, ns+"/"+pod, "", container, cmd, opts, idleTimeout,
		remotecommandconsts.DefaultStreamCreationTimeout, remotecommandconsts.SupportedStreamingProtocols)
}

func (r *runtime) servePortForward(w http.ResponseWriter, req *http.Request, ns, pod string) {
	opts, err := portforward.NewV4Options(req)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	portforward.ServePortForward(w, req, r, ns+"/"+pod, "", opts, idleTimeout,
		remotecommandconsts.DefaultStreamCreationTimeout, portforward.SupportedProtocols)
}

// ServeHTTP routes /exec/{ns}/{pod}/{container} and /portForward/{ns}/{pod}[/{uid}].
func (r *runtime) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	parts := strings.Split(strings.Trim(req.URL.Path, "/"), "/")
	switch {
	case len(parts) >= 4 && parts[0] == "exec":
		r.serveExec(w, req, parts[1], parts[2], parts[len(parts)-1])
	case len(parts) >= 3 && parts[0] == "portForward":
		r.servePortForward(w, req, parts[1], parts[2])
	case len(parts) == 1 && parts[0] == "healthz":
		_, _ = io.WriteString(w, "ok")
	default:
		http.Error(w, "not served by pdwarden-streaming: "+req.URL.Path, http.StatusNotFound)
	}
}

func main() {
	listen := flag.String("listen", "127.0.0.1:0", "loopback address to serve on (port 0: any; printed on stdout)")
	podsDir := flag.String("pods-dir", "", "the kubelet's pod directories (required)")
	ipBin := flag.String("ip", "/usr/sbin/ip", "iproute2's ip, for `ip netns exec`")
	flag.Parse()
	if *podsDir == "" {
		fmt.Fprintln(os.Stderr, "pdwarden-streaming: --pods-dir is required")
		os.Exit(2)
	}
	host, _, err := net.SplitHostPort(*listen)
	if err != nil || !net.ParseIP(host).IsLoopback() {
		fmt.Fprintf(os.Stderr, "pdwarden-streaming: --listen %q: want a loopback address\n", *listen)
		os.Exit(2)
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		fmt.Fprintf(os.Stderr, "pdwarden-streaming: %v\n", err)
		os.Exit(1)
	}
	fmt.Println(ln.Addr().String())
	srv := &http.Server{Handler: &runtime{podsDir: *podsDir, ipBin: *ipBin}, ReadHeaderTimeout: 30 * time.Second}
	go func() {
		stop := make(chan os.Signal, 1)
		signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
		<-stop
		_ = srv.Close()
	}()
	if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		fmt.Fprintf(os.Stderr, "pdwarden-streaming: %v\n", err)
		os.Exit(1)
	}
}
