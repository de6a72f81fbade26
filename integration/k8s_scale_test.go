//go:build linux

package integration

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/lbd-dev/lbd/internal/testnet"
	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
)

// How many LoadBalancer Services are created at once: the figure of the issue in the
// benchmark, a tenth of it in the test that `make check` runs.
const (
	k8sScaleBench = 1000
	k8sScaleCheck = 100
)

// k8sScalePool is the adapters' pool in the scale runs: IPv6, so that a thousand VIPs fit
// (2001:db8:ff::/118 holds 1,024).
var k8sScalePool = netip.MustParsePrefix("2001:db8:ff::/118")

// k8sScaleNodes are the Kubernetes Nodes the endpoints are on; their addresses answer on
// the LB node's link, so lbd resolves them as next hops.
const k8sScaleNodes = 4

// k8sScale is the world of the scale runs: the real kube-apiserver and etcd, one LB node
// running the real lbd binary (XDP attached to its uplink), and the real
// lbd-k8s-adapter next to it with its default client rate limits and sync interval.
type k8sScale struct {
	tb     testing.TB
	kube   *kubeCluster
	client kubernetes.Interface // the test's own client, not rate-limited
	lbd    lbdv1.LoadBalancerServiceClient
	rounds int
	// programmed makes a run also wait until lbd has programmed every Service into its
	// datapath and the Services' conditions say so.
	programmed bool
}

// k8sScaleResult is what one run measured, from the start of the creations.
type k8sScaleResult struct {
	// created: every Service and EndpointSlice created; status: every Service has its
	// VIP in status; inLbd: lbd holds every Service on that VIP; programmed (when the
	// run waits for it): lbd has programmed every one into its datapath.
	created, status, inLbd, programmed time.Duration
}

// programmedCondition is "status reason" of a Service's Programmed condition.
func programmedCondition(svc *corev1.Service) string {
	for _, c := range svc.Status.Conditions {
		if c.Type == "lbd-dev.github.io/Programmed" {
			return string(c.Status) + " " + c.Reason
		}
	}
	return "missing"
}

func newK8sScale(tb testing.TB) *k8sScale {
	tb.Helper()
	testnet.Require(tb, "ip", "nsenter")
	lbdBin, _ := binaries(tb)
	adapter := adapterBin(tb, lbdBin)
	dir, err := os.MkdirTemp("", "lbd-k8s-scale-")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { os.RemoveAll(dir) })
	kube := startKube(tb, dir)
	s := &k8sScale{tb: tb, kube: kube}
	fast := rest.CopyConfig(kube.config)
	fast.QPS, fast.Burst = -1, 0 // the test stands for many users: no client-side limit
	if s.client, err = kubernetes.NewForConfig(fast); err != nil {
		tb.Fatal(err)
	}

	sfx := testnet.Suffix(tb)
	lb := testnet.NewNS(tb, "lbdk8s-"+sfx)
	peer := testnet.NewNS(tb, "lbdk8s-"+sfx+"-p")
	up, down := "ku"+sfx, "kp"+sfx
	testnet.Veth(tb, testnet.VethEnd{NS: lb, Name: up}, testnet.VethEnd{NS: peer, Name: down})
	peer.PassXDP(tb, down) // XDP_TX out of the uplink needs a program on its peer
	lb.AddAddr(tb, up, netip.MustParsePrefix("2001:db8:f::1/64"))
	for i := range k8sScaleNodes {
		peer.AddAddr(tb, down, netip.PrefixFrom(k8sScaleNodeAddr(i), 64))
	}
	lb.Sysctl(tb, "net.ipv6.conf.all.forwarding=1")

	sock := filepath.Join(dir, "lbd.sock")
	proc := testnet.Start(tb, "lbd", filepath.Join(dir, "lbd.log"), lb.Command(lbdBin,
		"--role", "lb", "--interface", up, "--bpffs-dir", testnet.MountDir(tb),
		"--state-dir", filepath.Join(dir, "state"), "--socket", sock, "--log-level", "info"))
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { conn.Close() })
	s.lbd = lbdv1.NewLoadBalancerServiceClient(conn)
	node := lbdv1.NewNodeServiceClient(conn)
	s.wait(20*time.Second, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		resp, err := node.GetNode(ctx, &lbdv1.GetNodeRequest{})
		if err == nil && !resp.GetNode().GetDatapathAttached() {
			err = fmt.Errorf("datapath not attached")
		}
		if err != nil && !proc.Running() {
			tb.Fatalf("lbd exited:\n%s", proc.Tail(40))
		}
		return err
	})

	ctx := context.Background()
	kube.createNamespace(tb, "lbd-system")
	for i := range k8sScaleNodes {
		n, err := s.client.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("node-%d", i)}}, metav1.CreateOptions{})
		if err != nil {
			tb.Fatal(err)
		}
		n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: k8sScaleNodeAddr(i).String()}}
		if _, err := s.client.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{}); err != nil {
			tb.Fatal(err)
		}
	}
	cfg := filepath.Join(dir, "adapter.yaml")
	if err := os.WriteFile(cfg, fmt.Appendf(nil, "owner: %s\nlbdAddress: unix://%s\npools: [{name: scale, addresses: [%q]}]\n",
		k8sOwner, sock, k8sScalePool), 0o600); err != nil {
		tb.Fatal(err)
	}
	testnet.Start(tb, "lbd-k8s-adapter", filepath.Join(dir, "adapter.log"),
		exec.Command(adapter, "--config", cfg, "--kubeconfig", kube.kubeconfig, "--identity", "lb1"))
	return s
}

func k8sScaleNodeAddr(i int) netip.Addr {
	return netip.MustParseAddr(fmt.Sprintf("2001:db8:f::%x", 0x100+i))
}

// wait polls fn until it returns nil, failing the test after timeout.
func (s *k8sScale) wait(timeout time.Duration, fn func() error) {
	s.tb.Helper()
	eventually(s.tb, timeout, fn)
}

// run creates n LoadBalancer Services with an EndpointSlice each, at once from 16
// clients, in a namespace of their own; measures until every one has its VIP in status
// and is in lbd on it; then deletes them and waits until lbd holds none.
func (s *k8sScale) run(n int) k8sScaleResult {
	tb := s.tb
	tb.Helper()
	s.rounds++
	ns := fmt.Sprintf("scale-%d", s.rounds)
	s.kube.createNamespace(tb, ns)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	// What status says, as a watch (not a poll of a thousand objects) sees it.
	factory := informers.NewSharedInformerFactoryWithOptions(s.client, 0, informers.WithNamespace(ns))
	svcs := factory.Core().V1().Services()
	informer := svcs.Informer()
	factory.Start(ctx.Done())
	cache.WaitForCacheSync(ctx.Done(), informer.HasSynced)

	var res k8sScaleResult
	start := time.Now()
	errs := make(chan error, n)
	todo := make(chan int)
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			for i := range todo {
				errs <- s.create(ctx, ns, i)
			}
		})
	}
	for i := range n {
		todo <- i
	}
	close(todo)
	wg.Wait()
	res.created = time.Since(start)
	for range n {
		if err := <-errs; err != nil {
			tb.Fatal(err)
		}
	}

	timeout := 30*time.Second + time.Duration(n)*150*time.Millisecond
	want := map[string]string{} // lbd service name → VIP
	s.wait(timeout, func() error {
		list, err := svcs.Lister().Services(ns).List(labels.Everything())
		if err != nil {
			return err
		}
		clear(want)
		for _, svc := range list {
			if len(svc.Status.LoadBalancer.Ingress) == 1 {
				want[fmt.Sprintf("%s/%s/http/tcp/%s", ns, svc.Name, svc.Status.LoadBalancer.Ingress[0].IP)] = svc.Status.LoadBalancer.Ingress[0].IP
			}
		}
		if len(want) < n {
			return fmt.Errorf("%d of %d Services have their VIP in status", len(want), n)
		}
		return nil
	})
	res.status = time.Since(start)
	var programmed int
	s.wait(timeout, func() error {
		in, p, err := s.inLbd(want)
		if err == nil && in < n {
			err = fmt.Errorf("lbd holds %d of %d Services on their VIPs", in, n)
		}
		programmed = p
		return err
	})
	res.inLbd = time.Since(start)
	tb.Logf("%d LoadBalancer Services created in %v; all with a VIP in status after %v, in lbd after %v (%d programmed into its datapath by then)",
		n, res.created.Round(time.Millisecond), res.status.Round(time.Millisecond), res.inLbd.Round(time.Millisecond), programmed)
	if s.programmed {
		// Programming the datapath is lbd's own work, slower than the adapter's: a longer
		// bound. The Services' conditions then say so.
		s.wait(4*timeout, func() error {
			_, p, err := s.inLbd(want)
			if err == nil && p < n {
				err = fmt.Errorf("lbd has programmed %d of %d Services", p, n)
			}
			return err
		})
		res.programmed = time.Since(start)
		tb.Logf("all programmed after %v", res.programmed.Round(time.Millisecond))
		s.wait(timeout, func() error {
			list, err := svcs.Lister().Services(ns).List(labels.Everything())
			if err != nil {
				return err
			}
			for _, svc := range list {
				if c := programmedCondition(svc); c != "True Programmed" {
					return fmt.Errorf("service %s: condition %s", svc.Name, c)
				}
			}
			return nil
		})
	}
	s.remove(ns, n)
	return res
}

// create makes Service i of a run and its EndpointSlice (two endpoints on two nodes).
func (s *k8sScale) create(ctx context.Context, ns string, i int) error {
	single := corev1.IPFamilyPolicySingleStack
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("s%d", i)},
		Spec: corev1.ServiceSpec{
			Type:           corev1.ServiceTypeLoadBalancer,
			IPFamilyPolicy: &single,
			IPFamilies:     []corev1.IPFamily{corev1.IPv6Protocol},
			Ports:          []corev1.ServicePort{{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80}},
		},
	}
	if _, err := s.client.CoreV1().Services(ns).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create service %d: %w", i, err)
	}
	name, proto, port, ready := "http", corev1.ProtocolTCP, int32(8080), true
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: ns, Name: svc.Name + "-1", Labels: map[string]string{discoveryv1.LabelServiceName: svc.Name}},
		AddressType: discoveryv1.AddressTypeIPv6,
		Ports:       []discoveryv1.EndpointPort{{Name: &name, Protocol: &proto, Port: &port}},
	}
	for j := range 2 {
		node := fmt.Sprintf("node-%d", (i+j)%k8sScaleNodes)
		slice.Endpoints = append(slice.Endpoints, discoveryv1.Endpoint{
			Addresses:  []string{netip.MustParseAddr(fmt.Sprintf("2001:db8:10::%x:%x", i, j+1)).String()},
			Conditions: discoveryv1.EndpointConditions{Ready: &ready},
			NodeName:   &node,
		})
	}
	if _, err := s.client.DiscoveryV1().EndpointSlices(ns).Create(ctx, slice, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create endpoint slice %d: %w", i, err)
	}
	return nil
}

// inLbd counts the Services lbd holds on the VIP of their status (name → VIP in want),
// and how many of those it has programmed.
func (s *k8sScale) inLbd(want map[string]string) (in, programmed int, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := s.lbd.ListServices(ctx, &lbdv1.ListServicesRequest{Owner: k8sOwner})
	if err != nil {
		return 0, 0, fmt.Errorf("list lbd services: %w", err)
	}
	for _, svc := range resp.GetServices() {
		if vip, ok := want[svc.GetName()]; !ok || vip != svc.GetVip() {
			continue
		}
		in++
		switch svc.GetStatus().GetState() {
		case lbdv1.ServiceState_SERVICE_STATE_READY, lbdv1.ServiceState_SERVICE_STATE_NO_BACKENDS:
			programmed++
		}
	}
	return in, programmed, nil
}

// remove deletes a run's Services and slices and waits until lbd holds none of them.
func (s *k8sScale) remove(ns string, n int) {
	tb := s.tb
	tb.Helper()
	ctx := context.Background()
	todo := make(chan int)
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			for i := range todo {
				if err := s.client.CoreV1().Services(ns).Delete(ctx, fmt.Sprintf("s%d", i), metav1.DeleteOptions{}); err != nil {
					tb.Errorf("delete service %d: %v", i, err)
				}
			}
		})
	}
	for i := range n {
		todo <- i
	}
	close(todo)
	wg.Wait()
	if err := s.client.DiscoveryV1().EndpointSlices(ns).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{}); err != nil {
		tb.Errorf("delete endpoint slices: %v", err)
	}
	s.wait(2*time.Minute, func() error {
		resp, err := s.lbd.ListServices(ctx, &lbdv1.ListServicesRequest{Owner: k8sOwner})
		if err == nil && len(resp.GetServices()) > 0 {
			err = fmt.Errorf("lbd still holds %d services of the adapter", len(resp.GetServices()))
		}
		return err
	})
}

// TestKubernetesScale creates a hundred LoadBalancer Services at once against the real
// apiserver, adapter and lbd, and checks that every one gets its VIP in status, is
// programmed in lbd, and says so in its Programmed condition. It asserts no time:
// BenchmarkKubernetesScale measures the figure.
func TestKubernetesScale(t *testing.T) {
	s := newK8sScale(t)
	s.programmed = true
	s.run(k8sScaleCheck)
}

// BenchmarkKubernetesScale measures a thousand LoadBalancer Services created at once:
// seconds until all have their VIP in status (s-status), are held by lbd on that VIP
// (s-lbd) and are programmed into its datapath (s-programmed), each from the start of
// the creations (s-created: how long the creations took).
func BenchmarkKubernetesScale(b *testing.B) {
	s := newK8sScale(b)
	s.programmed = true
	var sum k8sScaleResult
	runs := 0
	for b.Loop() {
		r := s.run(k8sScaleBench)
		sum.created += r.created
		sum.status += r.status
		sum.inLbd += r.inLbd
		sum.programmed += r.programmed
		runs++
	}
	b.ReportMetric(0, "ns/op")
	b.ReportMetric(sum.created.Seconds()/float64(runs), "s-created")
	b.ReportMetric(sum.status.Seconds()/float64(runs), "s-status")
	b.ReportMetric(sum.inLbd.Seconds()/float64(runs), "s-lbd")
	b.ReportMetric(sum.programmed.Seconds()/float64(runs), "s-programmed")
}
