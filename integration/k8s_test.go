//go:build linux

package integration

import (
	"context"
	"fmt"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/util/retry"
)

// k8sOwner is the lbd owner name of the adapters: the testbed's own services (owned by
// lbctl's default owner) must survive every ApplyServices the adapters make.
const k8sOwner = "k8s-e2e"

// k8sPool is the adapters' address pool. It leaves out vip4, which the testbed's own
// services use, so an allocated VIP is the adapters' alone.
var k8sPool = netip.MustParsePrefix("203.0.113.64/28")

// TestKubernetesLoadBalancer runs the Kubernetes adapter end to end: a real kube-apiserver
// and etcd, one lbd-k8s-adapter per LB node (same owner, one Lease), and a LoadBalancer
// Service whose EndpointSlice points at the backend nodes' HTTP and echo servers. The
// elected adapter allocates a VIP from the pool and writes it to the Service status;
// every adapter programs its lbd, which announces the VIP to the router; HTTP from the
// client namespace reaches every backend with the client's address intact. An endpoint
// that turns not-ready drains (its open connection keeps working, new ones go
// elsewhere) and takes new connections again once ready; a requested address moves the
// Service to it and releases the old one. Deleting the Service withdraws the VIP from
// the router and leaves no service of the owner in lbd.
func TestKubernetesLoadBalancer(t *testing.T) {
	requireEnv(t)
	lbdBin, _ := binaries(t)
	bin := adapterBin(t, lbdBin)
	// The apiserver goes first, so that a missing binary skips before the testbed is
	// built, and it stops after the adapters that use it.
	start := time.Now()
	kube := startKube(t, t.TempDir())
	t.Logf("kube-apiserver and etcd started in %v", time.Since(start).Round(time.Millisecond))
	tb := newLB(t, options{})
	ctx := context.Background()

	const ns = "e2e"
	kube.createNamespace(t, ns)
	for _, be := range tb.backends {
		kube.createNode(t, be)
	}
	for _, lb := range tb.lbs {
		cfg := filepath.Join(tb.dir, "adapter-"+lb.name+".yaml")
		adapterConfig(t, cfg, k8sOwner, lb.lbd.sock, ns, k8sPool.String())
		tb.startAdapter(t, bin, lb, kube.kubeconfig, cfg)
	}

	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "web"},
		Spec: corev1.ServiceSpec{
			Type: corev1.ServiceTypeLoadBalancer,
			Ports: []corev1.ServicePort{
				{Name: "http", Protocol: corev1.ProtocolTCP, Port: webPort, TargetPort: intstr.FromInt32(httpPort)},
				{Name: "echo", Protocol: corev1.ProtocolTCP, Port: streamPt, TargetPort: intstr.FromInt32(echoPort)},
				{Name: "s1ap", Protocol: corev1.ProtocolSCTP, Port: sctpPort, TargetPort: intstr.FromInt32(sctpPort)},
			},
		},
	}
	if _, err := kube.client.CoreV1().Services(ns).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create service: %v", err)
	}
	if _, err := kube.client.DiscoveryV1().EndpointSlices(ns).Create(ctx, webSlice(tb, ns, ""), metav1.CreateOptions{}); err != nil {
		t.Fatalf("create endpoint slice: %v", err)
	}
	created := time.Now()

	// The leader allocates the VIP and writes it to the Service's status.
	var vip netip.Addr
	eventually(t, 30*time.Second, func() error {
		s, err := kube.client.CoreV1().Services(ns).Get(ctx, "web", metav1.GetOptions{})
		if err != nil {
			return fmt.Errorf("get service: %w", err)
		}
		ing := s.Status.LoadBalancer.Ingress
		if len(ing) != 1 {
			return fmt.Errorf("status.loadBalancer.ingress is %v, want one IP", ing)
		}
		a, err := netip.ParseAddr(ing[0].IP)
		if err != nil || !k8sPool.Contains(a) {
			return fmt.Errorf("ingress IP %q is not in the pool %v", ing[0].IP, k8sPool)
		}
		vip = a
		return nil
	})
	t.Logf("VIP %v allocated %v after the Service was created", vip, time.Since(created).Round(time.Millisecond))

	// Every lbd holds the Service on that VIP, ready, with the three backends behind their
	// nodes; both LB nodes then announce it.
	waitOwned(t, tb, webLines(tb, vip)...)
	tb.router.waitNextHops(t, vip, tb.lbs, 15*time.Second)
	t.Logf("VIP %v routed over every LB node %v after the Service was created", vip, time.Since(created).Round(time.Millisecond))

	const n = 60
	hs := tb.getMany(t, netip.AddrPortFrom(vip, webPort), n)
	for _, h := range hs {
		if h.seen != h.local.String() {
			t.Fatalf("backend %s saw client %s, the client was %v", h.backend, h.seen, h.local)
		}
	}
	counts := perBackend(hs)
	t.Logf("%d requests to %v, per backend: %v", n, vip, counts)
	for _, be := range tb.backends {
		if counts[be.name] == 0 {
			t.Errorf("%s answered none of %d requests", be.name, n)
		}
	}

	kubeNotReadyDrains(t, tb, kube, ns, vip)
	vip = kubeRequestedIPMoves(t, tb, kube, ns, vip)

	// Deleting the Service releases the VIP: no lbd keeps a service of the owner, and the
	// router loses its route. The testbed's own services stay.
	if err := kube.client.CoreV1().Services(ns).Delete(ctx, "web", metav1.DeleteOptions{}); err != nil {
		t.Fatalf("delete service: %v", err)
	}
	deleted := time.Now()
	eventually(t, 30*time.Second, func() error {
		for _, lb := range tb.lbs {
			got, err := ownedServices(lb.lbd)
			if err != nil {
				return fmt.Errorf("%s: %w", lb.name, err)
			}
			if len(got) != 0 {
				return fmt.Errorf("%s still holds %q for owner %s", lb.name, got, k8sOwner)
			}
		}
		return nil
	})
	tb.router.waitNextHops(t, vip, nil, 15*time.Second)
	t.Logf("VIP %v withdrawn %v after the Service was deleted", vip, time.Since(deleted).Round(time.Millisecond))
	tb.router.waitRoutes(t)
	if _, err := tb.get(webVIP); err != nil {
		t.Errorf("the testbed's own web service after the adapter's service went: %v", err)
	}
}

// ownedServices renders the services a daemon holds for the adapters' owner, one line
// each: "vip:port PROTO STATE [addr:port@node ...]".
func ownedServices(d *daemon) ([]string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	resp, err := d.lb.ListServices(ctx, &lbdv1.ListServicesRequest{Owner: k8sOwner})
	if err != nil {
		return nil, fmt.Errorf("list services: %w", err)
	}
	var out []string
	for _, s := range resp.GetServices() {
		var bes []string
		for _, b := range s.GetBackends() {
			bes = append(bes, fmt.Sprintf("%s:%d@%s", b.GetAddress(), b.GetPort(), b.GetNodeAddress()))
		}
		out = append(out, fmt.Sprintf("%s:%d %s %s [%s]", s.GetVip(), s.GetPort(),
			strings.TrimPrefix(s.GetProtocol().String(), "PROTOCOL_"),
			strings.TrimPrefix(s.GetStatus().GetState().String(), "SERVICE_STATE_"), strings.Join(bes, " ")))
	}
	return out, nil
}

// webSlice is the EndpointSlice of the Service web: every backend node's HTTP, echo and
// SCTP ports, ready, except notReady (a backend name), which is not ready.
func webSlice(tb *testbed, ns, notReady string) *discoveryv1.EndpointSlice {
	http, echo, s1ap, tcp, sctp := "http", "echo", "s1ap", corev1.ProtocolTCP, corev1.ProtocolSCTP
	hp, ep, sp := int32(httpPort), int32(echoPort), int32(sctpPort)
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: ns, Name: "web-1", Labels: map[string]string{discoveryv1.LabelServiceName: "web"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports: []discoveryv1.EndpointPort{{Name: &http, Protocol: &tcp, Port: &hp}, {Name: &echo, Protocol: &tcp, Port: &ep},
			{Name: &s1ap, Protocol: &sctp, Port: &sp}},
	}
	for _, be := range tb.backends {
		nodeName := be.name
		ready := be.name != notReady
		terminating := false
		slice.Endpoints = append(slice.Endpoints, discoveryv1.Endpoint{
			Addresses:  []string{be.addr4.String()},
			Conditions: discoveryv1.EndpointConditions{Ready: &ready, Serving: &ready, Terminating: &terminating},
			NodeName:   &nodeName,
		})
	}
	return slice
}

// putWebSlice replaces the EndpointSlice of the Service web.
func putWebSlice(t *testing.T, tb *testbed, kube *kubeCluster, ns, notReady string) {
	t.Helper()
	ctx := context.Background()
	old, err := kube.client.DiscoveryV1().EndpointSlices(ns).Get(ctx, "web-1", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("get endpoint slice: %v", err)
	}
	s := webSlice(tb, ns, notReady)
	s.ResourceVersion = old.ResourceVersion
	if _, err := kube.client.DiscoveryV1().EndpointSlices(ns).Update(ctx, s, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("update endpoint slice: %v", err)
	}
}

// webLines are what every lbd holds for the Service web on vip, ready: its three ports,
// every backend behind its node.
func webLines(tb *testbed, vip netip.Addr) []string {
	var http, echo, s1ap []string
	for _, be := range tb.backends {
		http = append(http, fmt.Sprintf("%s:%d@%s", be.addr4, httpPort, be.addr4))
		echo = append(echo, fmt.Sprintf("%s:%d@%s", be.addr4, echoPort, be.addr4))
		s1ap = append(s1ap, fmt.Sprintf("%s:%d@%s", be.addr4, sctpPort, be.addr4))
	}
	return []string{
		fmt.Sprintf("%s:%d TCP READY [%s]", vip, webPort, strings.Join(http, " ")),
		fmt.Sprintf("%s:%d TCP READY [%s]", vip, streamPt, strings.Join(echo, " ")),
		fmt.Sprintf("%s:%d SCTP READY [%s]", vip, sctpPort, strings.Join(s1ap, " ")),
	}
}

// waitOwned waits until every lbd holds exactly these services of the adapters' owner.
func waitOwned(t *testing.T, tb *testbed, want ...string) {
	t.Helper()
	slices.Sort(want)
	eventually(t, 30*time.Second, func() error {
		for _, lb := range tb.lbs {
			got, err := ownedServices(lb.lbd)
			if err != nil {
				return fmt.Errorf("%s: %w", lb.name, err)
			}
			slices.Sort(got)
			if !slices.Equal(got, want) {
				return fmt.Errorf("%s holds %q for owner %s, want %q", lb.name, got, k8sOwner, want)
			}
		}
		return nil
	})
}

// kubeNotReadyDrains turns the endpoint on be1 not-ready while a TCP connection to it is
// open: the connection keeps working end to end and no new connection goes to be1; ready
// again, be1 takes new connections.
func kubeNotReadyDrains(t *testing.T, tb *testbed, kube *kubeCluster, ns string, vip netip.Addr) {
	t.Helper()
	be := tb.backends[0]
	to := netip.AddrPortFrom(vip, streamPt)
	lbdName := fmt.Sprintf("%s/web/echo/tcp/%s", ns, vip)
	ap := netip.AddrPortFrom(be.addr4, echoPort)
	s := tb.streamOn(t, to, be.name)

	putWebSlice(t, tb, kube, ns, be.name)
	tb.waitService(t, lbdName, func(svc *lbdv1.Service) error {
		for _, b := range svc.GetBackends() {
			if b.GetAddress() == be.addr4.String() && b.GetPort() == echoPort {
				if b.GetState() != lbdv1.BackendState_BACKEND_STATE_DRAINING {
					return fmt.Errorf("backend %v is %v", ap, b.GetState())
				}
				return nil
			}
		}
		return fmt.Errorf("no backend %v: a not-ready endpoint must drain, not leave", ap)
	})
	tb.waitSlots(t, lbdName, ap, func(n uint32) bool { return n == 0 })
	got := map[string]int{}
	for range 100 {
		got[tb.echoOnce(t, to)]++
	}
	t.Logf("new connections while the endpoint on %s is not ready: %v", be.name, got)
	if got[be.name] != 0 {
		t.Errorf("%d of 100 new connections reached the not-ready endpoint on %s", got[be.name], be.name)
	}
	if err := s.progress(50, 5*time.Second); err != nil {
		t.Fatalf("established connection to the not-ready endpoint: %v", err)
	}

	putWebSlice(t, tb, kube, ns, "")
	tb.waitSlots(t, lbdName, ap, func(n uint32) bool { return n > 0 })
	got = map[string]int{}
	for range 100 {
		got[tb.echoOnce(t, to)]++
	}
	t.Logf("new connections once the endpoint on %s is ready again: %v", be.name, got)
	// An equal share is 33; 15 is four standard deviations below it.
	if got[be.name] < 15 {
		t.Errorf("%d of 100 new connections reached %s once ready again", got[be.name], be.name)
	}
	if err := s.progress(20, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	s.close()
}

// kubeRequestedIPMoves asks for another address of the pool with the adapter's
// annotation: status and every lbd carry only the new one, the router routes it and
// HTTP reaches the backends on it, and the old one is withdrawn. It returns the new VIP.
func kubeRequestedIPMoves(t *testing.T, tb *testbed, kube *kubeCluster, ns string, old netip.Addr) netip.Addr {
	t.Helper()
	ctx := context.Background()
	vip := old.Next()
	if !k8sPool.Contains(vip) {
		vip = k8sPool.Addr()
	}
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		s, err := kube.client.CoreV1().Services(ns).Get(ctx, "web", metav1.GetOptions{})
		if err != nil {
			return err
		}
		s.Annotations = map[string]string{"lbd-dev.github.io/load-balancer-ips": vip.String()}
		_, err = kube.client.CoreV1().Services(ns).Update(ctx, s, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		t.Fatalf("ask for %v: %v", vip, err)
	}
	start := time.Now()
	eventually(t, 30*time.Second, func() error {
		s, err := kube.client.CoreV1().Services(ns).Get(ctx, "web", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if ing := s.Status.LoadBalancer.Ingress; len(ing) != 1 || ing[0].IP != vip.String() {
			return fmt.Errorf("status.loadBalancer.ingress is %v, want %v alone", ing, vip)
		}
		return nil
	})
	waitOwned(t, tb, webLines(tb, vip)...)
	t.Logf("requested %v: status and every lbd hold it alone %v later", vip, time.Since(start).Round(time.Millisecond))
	tb.router.waitNextHops(t, vip, tb.lbs, 15*time.Second)
	tb.router.waitNextHops(t, old, nil, 15*time.Second)
	t.Logf("%v routed over every LB node and %v withdrawn %v after the request", vip, old, time.Since(start).Round(time.Millisecond))
	if counts := perBackend(tb.getMany(t, netip.AddrPortFrom(vip, webPort), 30)); len(counts) != len(tb.backends) {
		t.Errorf("30 requests to the new VIP %v reached %v, want every backend", vip, counts)
	}
	return vip
}
