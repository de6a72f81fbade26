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
)

// k8sOwner is the lbd owner name of the adapters: the testbed's own services (owned by
// lbctl's default owner) must survive every ApplyServices the adapters make.
const k8sOwner = "k8s-e2e"

// k8sPool is the adapters' address pool. It leaves out vip4, which the testbed's own
// services use, so an allocated VIP is the adapters' alone.
var k8sPool = netip.MustParsePrefix("203.0.113.64/28")

// TestKubernetesLoadBalancer runs the Kubernetes adapter end to end: a real kube-apiserver
// and etcd, one lbd-k8s-adapter per LB node (same owner, one Lease), and a LoadBalancer
// Service whose EndpointSlice points at the backend nodes' HTTP servers. The elected
// adapter allocates a VIP from the pool and writes it to the Service status; every
// adapter programs its lbd, which announces the VIP to the router; HTTP from the client
// namespace reaches every backend with the client's address intact. Deleting the Service
// withdraws the VIP from the router and leaves no service of the owner in lbd.
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
			Ports: []corev1.ServicePort{{
				Name: "http", Protocol: corev1.ProtocolTCP, Port: webPort, TargetPort: intstr.FromInt32(httpPort),
			}, {
				Name: "s1ap", Protocol: corev1.ProtocolSCTP, Port: sctpPort, TargetPort: intstr.FromInt32(sctpPort),
			}},
		},
	}
	if _, err := kube.client.CoreV1().Services(ns).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create service: %v", err)
	}
	portName, proto, port, ready := "http", corev1.ProtocolTCP, int32(httpPort), true
	sctpName, sctpProto, sctpNum := "s1ap", corev1.ProtocolSCTP, int32(sctpPort)
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: ns, Name: "web-1", Labels: map[string]string{discoveryv1.LabelServiceName: "web"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports: []discoveryv1.EndpointPort{{Name: &portName, Protocol: &proto, Port: &port},
			{Name: &sctpName, Protocol: &sctpProto, Port: &sctpNum}},
	}
	for _, be := range tb.backends {
		nodeName := be.name
		slice.Endpoints = append(slice.Endpoints, discoveryv1.Endpoint{
			Addresses:  []string{be.addr4.String()},
			Conditions: discoveryv1.EndpointConditions{Ready: &ready},
			NodeName:   &nodeName,
		})
	}
	if _, err := kube.client.DiscoveryV1().EndpointSlices(ns).Create(ctx, slice, metav1.CreateOptions{}); err != nil {
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

	// Every lbd holds the Service's ports on that VIP, TCP and SCTP, ready, with the three
	// backends behind their nodes; both LB nodes then announce it.
	var want, wantSCTP []string
	for _, be := range tb.backends {
		want = append(want, fmt.Sprintf("%s:%d@%s", be.addr4, httpPort, be.addr4))
		wantSCTP = append(wantSCTP, fmt.Sprintf("%s:%d@%s", be.addr4, sctpPort, be.addr4))
	}
	wantLines := []string{fmt.Sprintf("%s:%d TCP READY [%s]", vip, webPort, strings.Join(want, " ")),
		fmt.Sprintf("%s:%d SCTP READY [%s]", vip, sctpPort, strings.Join(wantSCTP, " "))}
	eventually(t, 30*time.Second, func() error {
		for _, lb := range tb.lbs {
			got, err := ownedServices(lb.lbd)
			if err != nil {
				return fmt.Errorf("%s: %w", lb.name, err)
			}
			if !slices.Equal(got, wantLines) {
				return fmt.Errorf("%s holds %q for owner %s, want %q", lb.name, got, k8sOwner, wantLines)
			}
		}
		return nil
	})
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
