package controller_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/lbd-dev/lbd/cmd/lbd-k8s-adapter/internal/config"
	"github.com/lbd-dev/lbd/cmd/lbd-k8s-adapter/internal/controller"
	"github.com/lbd-dev/lbd/cmd/lbd-k8s-adapter/internal/k8stest"
	"github.com/lbd-dev/lbd/daemon/api"
	"github.com/lbd-dev/lbd/daemon/reconcile"
	"github.com/lbd-dev/lbd/daemon/store"
	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
	"google.golang.org/grpc"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/yaml"
)

const (
	testOwner = "k8s-test"
	testClass = "test.lbd.example/lbd"
)

// cluster is the package's apiserver + etcd, shared by the tests (they run one after the
// other, each in its own namespace, and delete what they create).
var (
	cluster    *k8stest.Cluster
	clusterErr string
)

func TestMain(m *testing.M) {
	if clusterErr = k8stest.Missing(); clusterErr == "" {
		c, err := k8stest.Start()
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		cluster = c
	}
	code := m.Run()
	if cluster != nil {
		if err := cluster.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, err)
		}
	}
	os.Exit(code)
}

// env is one test's world: a namespace, a kube client, an lbd.
type env struct {
	t    *testing.T
	kube kubernetes.Interface
	ns   string
	lbd  *lbdServer
	ctx  context.Context
}

func newEnv(t *testing.T) *env {
	t.Helper()
	return newEnvLimits(t, store.DefaultLimits())
}

// newEnvLimits is newEnv with an lbd that has these limits.
func newEnvLimits(t *testing.T, lim store.Limits) *env {
	t.Helper()
	if cluster == nil {
		t.Skip(clusterErr)
	}
	kube, err := kubernetes.NewForConfig(cluster.Config)
	if err != nil {
		t.Fatalf("kube client: %v", err)
	}
	e := &env{t: t, kube: kube, ns: "t-" + suffix(), ctx: context.Background()}
	if _, err := kube.CoreV1().Namespaces().Create(e.ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: e.ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create namespace: %v", err)
	}
	// No namespace controller runs here: delete what the test made, or the next test's
	// adapter would see it.
	t.Cleanup(func() {
		ctx := context.Background()
		if list, err := kube.CoreV1().Services(e.ns).List(ctx, metav1.ListOptions{}); err == nil {
			for _, s := range list.Items {
				_ = kube.CoreV1().Services(e.ns).Delete(ctx, s.Name, metav1.DeleteOptions{})
			}
		}
		_ = kube.DiscoveryV1().EndpointSlices(e.ns).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{})
	})
	e.lbd = startLbd(t, lim)
	return e
}

func suffix() string {
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// config is the adapter configuration of a test: fast syncs and a fast Lease, external
// IPs served. Without pools, one pool that only Services naming it allocate from
// ("ext", 203.0.113.0/24 and 2001:db8:ff::/48) lets the tests' external IPs pass.
func (e *env) config(pools ...config.Pool) *config.Config {
	e.t.Helper()
	yes, no := true, false
	if len(pools) == 0 {
		pools = []config.Pool{{Name: "ext", Addresses: []string{"203.0.113.0/24", "2001:db8:ff::/48"}, AutoAssign: &no}}
	}
	c := &config.Config{
		Owner:             testOwner,
		LbdAddress:        "unix://" + e.lbd.sock,
		LoadBalancerClass: testClass,
		ClaimClassless:    &yes,
		ExternalIPs:       &yes,
		Pools:             pools,
		Sync: config.Sync{
			MinInterval: metav1.Duration{Duration: 50 * time.Millisecond},
			MaxInterval: metav1.Duration{Duration: time.Minute},
		},
		LeaderElection: config.LeaderElection{
			Namespace:     e.ns,
			LeaseDuration: metav1.Duration{Duration: 3 * time.Second},
			RenewDeadline: metav1.Duration{Duration: 2 * time.Second},
			RetryPeriod:   metav1.Duration{Duration: 200 * time.Millisecond},
		},
	}
	data, err := yamlConfig(c)
	if err != nil {
		e.t.Fatalf("encode config: %v", err)
	}
	// Round-trip through the parser so the test runs what a config file would give.
	parsed, err := config.Parse(data)
	if err != nil {
		e.t.Fatalf("parse config: %v", err)
	}
	return parsed
}

// adapter is one running lbd-k8s-adapter.
type adapter struct {
	stop func()
	done chan error
}

// startAdapter runs an adapter until stopped or the test ends.
func (e *env) startAdapter(cfg *config.Config, identity string) *adapter {
	e.t.Helper()
	conn, err := controller.DialLbd(cfg.LbdAddress)
	if err != nil {
		e.t.Fatalf("dial lbd: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	a := &adapter{done: make(chan error, 1)}
	log := slog.New(slog.NewTextHandler(testWriter{e.t}, &slog.HandlerOptions{Level: slog.LevelInfo}))
	go func() {
		a.done <- controller.Run(ctx, controller.Options{Config: cfg, Kube: e.kube, Lbd: conn, Identity: identity, Log: log})
	}()
	stopped := false
	a.stop = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		select {
		case err := <-a.done:
			if err != nil {
				e.t.Errorf("adapter %s: %v", identity, err)
			}
		case <-time.After(15 * time.Second):
			e.t.Errorf("adapter %s did not stop", identity)
		}
		conn.Close()
	}
	e.t.Cleanup(a.stop)
	return a
}

// running fails the test if the adapter has returned.
func (a *adapter) running(t *testing.T) {
	t.Helper()
	select {
	case err := <-a.done:
		t.Fatalf("adapter exited: %v", err)
	default:
	}
}

// testWriter sends logs to the test's log, shown on failure or with -v.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// lbdServer is lbd's real API, store and reconciler, in-process, on a socket that
// survives restarts. The reconciler programs an in-memory datapath, so services become
// READY (or NO_BACKENDS) as in a real lbd.
type lbdServer struct {
	t      *testing.T
	sock   string
	limits store.Limits
	g      *grpc.Server
	st     *store.Store
	stopDP func()
	client lbdv1.LoadBalancerServiceClient
}

func startLbd(t *testing.T, lim store.Limits) *lbdServer {
	t.Helper()
	dir, err := os.MkdirTemp("", "lbdk8s-")
	if err != nil {
		t.Fatalf("socket dir: %v", err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	s := &lbdServer{t: t, sock: filepath.Join(dir, "lbd.sock"), limits: lim}
	conn, err := controller.DialLbd("unix://" + s.sock)
	if err != nil {
		t.Fatalf("dial lbd: %v", err)
	}
	t.Cleanup(func() { conn.Close() })
	s.client = lbdv1.NewLoadBalancerServiceClient(conn)
	s.start()
	t.Cleanup(s.stop)
	return s
}

// start serves the API with an empty state, as an lbd that lost its state would.
func (s *lbdServer) start() {
	s.t.Helper()
	st, err := store.Open(store.Options{Path: filepath.Join(s.t.TempDir(), "state.pb"), Limits: s.limits})
	if err != nil {
		s.t.Fatalf("open store: %v", err)
	}
	_ = os.Remove(s.sock)
	ln, err := net.Listen("unix", s.sock)
	if err != nil {
		s.t.Fatalf("listen: %v", err)
	}
	g := grpc.NewServer()
	api.New(api.Options{Store: st, Version: "test"}).Register(g)
	go func() { _ = g.Serve(ln) }() // returns on Stop
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = reconcile.New(st, reconcile.NewFake(), nil).Run(ctx)
	}()
	s.g, s.st = g, st
	s.stopDP = func() { cancel(); <-done }
}

func (s *lbdServer) stop() {
	if s.g == nil {
		return
	}
	s.g.Stop()
	s.stopDP()
	s.st.Close()
	s.g, s.st = nil, nil
}

// services renders what lbd holds for the test's namespace, one line per service:
// "name vip:port PROTO [affinity=..] [ranges=..] [addr:port@node(draining) ...]".
func (e *env) services() ([]string, error) {
	if e.lbd.st == nil {
		return nil, fmt.Errorf("lbd is stopped")
	}
	resp, err := e.lbd.client.ListServices(e.ctx, &lbdv1.ListServicesRequest{Owner: testOwner})
	if err != nil {
		return nil, err
	}
	out := []string{}
	for _, s := range resp.Services {
		if strings.HasPrefix(s.Name, e.ns+"/") {
			out = append(out, render(strings.TrimPrefix(s.Name, e.ns+"/"), s))
		}
	}
	sort.Strings(out)
	return out, nil
}

func render(name string, s *lbdv1.Service) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s:%d %s", name, s.Vip, s.Port, strings.TrimPrefix(s.Protocol.String(), "PROTOCOL_"))
	if s.SessionAffinity != nil {
		fmt.Fprintf(&b, " affinity=%s", s.SessionAffinity.Timeout.AsDuration())
	}
	if len(s.SourceRanges) > 0 {
		fmt.Fprintf(&b, " ranges=%s", strings.Join(s.SourceRanges, ","))
	}
	b.WriteString(" [")
	for i, be := range s.Backends {
		if i > 0 {
			b.WriteString(" ")
		}
		fmt.Fprintf(&b, "%s:%d@%s", be.Address, be.Port, be.NodeAddress)
		if be.State == lbdv1.BackendState_BACKEND_STATE_DRAINING {
			b.WriteString("(draining)")
		}
	}
	b.WriteString("]")
	return b.String()
}

// expect waits until lbd holds exactly want for the namespace (names without the
// namespace prefix), and fails with the last state seen.
func (e *env) expect(step string, want ...string) {
	e.t.Helper()
	if want == nil {
		want = []string{}
	}
	sort.Strings(want)
	var got []string
	var err error
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		got, err = e.services()
		if err == nil && strings.Join(got, "\n") == strings.Join(want, "\n") {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	e.t.Fatalf("%s: lbd holds\n  %s\nwant\n  %s\n(last error: %v)", step, strings.Join(got, "\n  "), strings.Join(want, "\n  "), err)
}

// eventually polls cond until it holds or 20 s pass.
func (e *env) eventually(what string, cond func() (bool, string)) {
	e.t.Helper()
	var last string
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		ok, state := cond()
		if ok {
			return
		}
		last = state
		time.Sleep(50 * time.Millisecond)
	}
	e.t.Fatalf("%s: never happened; last state: %s", what, last)
}

// Kubernetes object helpers.

func (e *env) createNode(name string, internalIPs ...string) {
	e.t.Helper()
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}
	created, err := e.kube.CoreV1().Nodes().Create(e.ctx, n, metav1.CreateOptions{})
	if err != nil {
		e.t.Fatalf("create node: %v", err)
	}
	e.t.Cleanup(func() { _ = e.kube.CoreV1().Nodes().Delete(context.Background(), name, metav1.DeleteOptions{}) })
	for _, ip := range internalIPs {
		created.Status.Addresses = append(created.Status.Addresses, corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: ip})
	}
	if _, err := e.kube.CoreV1().Nodes().UpdateStatus(e.ctx, created, metav1.UpdateOptions{}); err != nil {
		e.t.Fatalf("set node addresses: %v", err)
	}
}

type svcSpec func(*corev1.Service)

func (e *env) createService(name string, typ corev1.ServiceType, opts ...svcSpec) *corev1.Service {
	e.t.Helper()
	s := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: e.ns, Name: name},
		Spec: corev1.ServiceSpec{
			Type:  typ,
			Ports: []corev1.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP}},
		},
	}
	for _, o := range opts {
		o(s)
	}
	created, err := e.kube.CoreV1().Services(e.ns).Create(e.ctx, s, metav1.CreateOptions{})
	if err != nil {
		e.t.Fatalf("create service %s: %v", name, err)
	}
	return created
}

// updateService reads, edits and writes a Service (spec and metadata), again if the
// adapter wrote its status in between, as kubectl edit would be retried.
func (e *env) updateService(name string, edit svcSpec) {
	e.t.Helper()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		s, err := e.kube.CoreV1().Services(e.ns).Get(e.ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		edit(s)
		_, err = e.kube.CoreV1().Services(e.ns).Update(e.ctx, s, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		e.t.Fatalf("update service %s: %v", name, err)
	}
}

// setIngress writes status.loadBalancer.ingress, as another allocator (or a cloud) would.
func (e *env) setIngress(name string, ips ...string) {
	e.t.Helper()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		s, err := e.kube.CoreV1().Services(e.ns).Get(e.ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		s.Status.LoadBalancer.Ingress = nil
		for _, ip := range ips {
			s.Status.LoadBalancer.Ingress = append(s.Status.LoadBalancer.Ingress, corev1.LoadBalancerIngress{IP: ip})
		}
		_, err = e.kube.CoreV1().Services(e.ns).UpdateStatus(e.ctx, s, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		e.t.Fatalf("set ingress of %s: %v", name, err)
	}
}

func (e *env) deleteService(name string) {
	e.t.Helper()
	if err := e.kube.CoreV1().Services(e.ns).Delete(e.ctx, name, metav1.DeleteOptions{}); err != nil {
		e.t.Fatalf("delete service %s: %v", name, err)
	}
}

// endpoint is a test endpoint; conditions as in the EndpointSlice API.
type endpoint struct {
	addr, node                  string
	ready, serving, terminating bool
}

func ready(addr, node string) endpoint {
	return endpoint{addr: addr, node: node, ready: true, serving: true}
}
func notReady(addr, node string) endpoint {
	return endpoint{addr: addr, node: node}
}
func terminating(addr, node string, serving bool) endpoint {
	return endpoint{addr: addr, node: node, serving: serving, terminating: true}
}

// putSlice creates or replaces an EndpointSlice of a Service with one TCP port; it is an
// IPv6 slice if the first endpoint is.
func (e *env) putSlice(name, service, portName string, port int32, eps ...endpoint) {
	e.t.Helper()
	e.putSliceProto(name, service, portName, corev1.ProtocolTCP, port, eps...)
}

// putSliceProto is putSlice with a port of any protocol.
func (e *env) putSliceProto(name, service, portName string, proto corev1.Protocol, port int32, eps ...endpoint) {
	e.t.Helper()
	s := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: e.ns, Name: name, Labels: map[string]string{discoveryv1.LabelServiceName: service}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: &portName, Protocol: &proto, Port: &port}},
	}
	if len(eps) > 0 && strings.Contains(eps[0].addr, ":") {
		s.AddressType = discoveryv1.AddressTypeIPv6
	}
	for _, ep := range eps {
		r, sv, te := ep.ready, ep.serving, ep.terminating
		d := discoveryv1.Endpoint{Addresses: []string{ep.addr}, Conditions: discoveryv1.EndpointConditions{Ready: &r, Serving: &sv, Terminating: &te}}
		if ep.node != "" {
			node := ep.node
			d.NodeName = &node
		}
		s.Endpoints = append(s.Endpoints, d)
	}
	slices := e.kube.DiscoveryV1().EndpointSlices(e.ns)
	old, err := slices.Get(e.ctx, name, metav1.GetOptions{})
	if err == nil {
		s.ResourceVersion = old.ResourceVersion
		_, err = slices.Update(e.ctx, s, metav1.UpdateOptions{})
	} else {
		_, err = slices.Create(e.ctx, s, metav1.CreateOptions{})
	}
	if err != nil {
		e.t.Fatalf("put endpoint slice %s: %v", name, err)
	}
}

func (e *env) deleteSlice(name string) {
	e.t.Helper()
	if err := e.kube.DiscoveryV1().EndpointSlices(e.ns).Delete(e.ctx, name, metav1.DeleteOptions{}); err != nil {
		e.t.Fatalf("delete endpoint slice %s: %v", name, err)
	}
}

// ingress returns a Service's status ingress IPs.
func (e *env) ingress(name string) []string {
	s, err := e.kube.CoreV1().Services(e.ns).Get(e.ctx, name, metav1.GetOptions{})
	if err != nil {
		return []string{"error: " + err.Error()}
	}
	out := []string{}
	for _, ing := range s.Status.LoadBalancer.Ingress {
		out = append(out, ing.IP)
	}
	return out
}

// events returns "Type Reason: message" of the Events of a Service.
func (e *env) events(name string) []string {
	list, err := e.kube.CoreV1().Events(e.ns).List(e.ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + name})
	if err != nil {
		return []string{"error: " + err.Error()}
	}
	var out []string
	for _, ev := range list.Items {
		out = append(out, ev.Type+" "+ev.Reason+": "+ev.Message)
	}
	return out
}

var (
	metav1GetOptions    = metav1.GetOptions{}
	metav1UpdateOptions = metav1.UpdateOptions{}
)

func deleteReq(name string) *lbdv1.DeleteServiceRequest {
	return &lbdv1.DeleteServiceRequest{Name: name}
}

// createReq is an operator's service (no owner) on vip:80/TCP.
func createReq(name, vip string) *lbdv1.CreateServiceRequest {
	return &lbdv1.CreateServiceRequest{Service: &lbdv1.Service{Name: name, Vip: vip, Port: 80, Protocol: lbdv1.Protocol_PROTOCOL_TCP}}
}

// conditions returns "type=status reason: message" of a Service's conditions, sorted.
func (e *env) conditions(name string) []string {
	s, err := e.kube.CoreV1().Services(e.ns).Get(e.ctx, name, metav1.GetOptions{})
	if err != nil {
		return []string{"error: " + err.Error()}
	}
	out := []string{}
	for _, c := range s.Status.Conditions {
		out = append(out, fmt.Sprintf("%s=%s %s: %s", c.Type, c.Status, c.Reason, c.Message))
	}
	sort.Strings(out)
	return out
}

// kubectl runs the test binaries' kubectl against the cluster in the test's namespace,
// skipping the test if there is none.
func (e *env) kubectl(args ...string) string {
	e.t.Helper()
	if why := k8stest.MissingKubectl(); why != "" {
		e.t.Skip(why)
	}
	kubeconfig := filepath.Join(e.t.TempDir(), "kubeconfig")
	if err := cluster.WriteKubeconfig(kubeconfig); err != nil {
		e.t.Fatal(err)
	}
	cmd := exec.Command(k8stest.Kubectl(), append([]string{"--kubeconfig", kubeconfig, "--namespace", e.ns}, args...)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		e.t.Fatalf("kubectl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

func yamlConfig(c *config.Config) ([]byte, error) { return yaml.Marshal(c) }
