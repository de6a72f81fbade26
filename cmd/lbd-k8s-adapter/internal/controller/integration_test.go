package controller_test

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/lbd-dev/lbd/cmd/lbd-k8s-adapter/internal/config"
	"github.com/lbd-dev/lbd/cmd/lbd-k8s-adapter/internal/translate"
	corev1 "k8s.io/api/core/v1"
)

// TestServicesAndEndpoints follows one LoadBalancer Service through the changes a cluster
// makes to it and its EndpointSlices, asserting what lbd holds after each step.
func TestServicesAndEndpoints(t *testing.T) {
	e := newEnv(t)
	n1, n2 := "n1-"+e.ns, "n2-"+e.ns
	e.createNode(n1, "198.18.1.1")
	e.createNode(n2, "198.18.1.2")
	e.startAdapter(e.config(), "a1")

	e.createService("web", corev1.ServiceTypeLoadBalancer)
	e.putSlice("web-1", "web", "http", 8080, ready("198.18.10.1", n1), ready("198.18.10.2", n2))
	e.expect("no ingress IP yet")
	e.setIngress("web", "203.0.113.10")
	e.expect("ingress IP set",
		"web/http/tcp/203.0.113.10 203.0.113.10:80 TCP [198.18.10.1:8080@198.18.1.1 198.18.10.2:8080@198.18.1.2]")

	e.putSlice("web-1", "web", "http", 8080, ready("198.18.10.1", n1), notReady("198.18.10.2", n2))
	e.expect("endpoint 2 not ready: it drains",
		"web/http/tcp/203.0.113.10 203.0.113.10:80 TCP [198.18.10.1:8080@198.18.1.1 198.18.10.2:8080@198.18.1.2(draining)]")

	e.putSlice("web-1", "web", "http", 8080, ready("198.18.10.1", n1), ready("198.18.10.2", n2))
	e.expect("endpoint 2 ready again",
		"web/http/tcp/203.0.113.10 203.0.113.10:80 TCP [198.18.10.1:8080@198.18.1.1 198.18.10.2:8080@198.18.1.2]")

	e.putSlice("web-1", "web", "http", 8080, terminating("198.18.10.1", n1, true), notReady("198.18.10.2", n2))
	e.expect("no ready endpoint: the serving terminating one takes new flows",
		"web/http/tcp/203.0.113.10 203.0.113.10:80 TCP [198.18.10.1:8080@198.18.1.1 198.18.10.2:8080@198.18.1.2(draining)]")

	// A second slice brings a ready endpoint: the terminating one drains.
	e.putSlice("web-1", "web", "http", 8080, terminating("198.18.10.1", n1, true))
	e.putSlice("web-2", "web", "http", 8080, ready("198.18.10.3", ""))
	e.expect("ready endpoint in a second slice, terminating one drains",
		"web/http/tcp/203.0.113.10 203.0.113.10:80 TCP [198.18.10.1:8080@198.18.1.1(draining) 198.18.10.3:8080@198.18.10.3]")

	e.updateService("web", func(s *corev1.Service) {
		secs := int32(600)
		s.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
		s.Spec.SessionAffinityConfig = &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: &secs}}
		s.Spec.LoadBalancerSourceRanges = []string{"198.51.100.0/24", "198.18.0.0/15"}
	})
	e.expect("affinity and source ranges",
		"web/http/tcp/203.0.113.10 203.0.113.10:80 TCP affinity=10m0s ranges=198.18.0.0/15,198.51.100.0/24 [198.18.10.1:8080@198.18.1.1(draining) 198.18.10.3:8080@198.18.10.3]")

	e.updateService("web", func(s *corev1.Service) {
		s.Spec.SessionAffinityConfig = nil // back to Kubernetes' default timeout
		s.Spec.LoadBalancerSourceRanges = nil
		s.Spec.Ports = append(s.Spec.Ports, corev1.ServicePort{Name: "dns", Port: 53, Protocol: corev1.ProtocolUDP})
	})
	e.putSliceProto("web-3", "web", "dns", corev1.ProtocolUDP, 5353, ready("198.18.10.4", n2))
	e.expect("default affinity timeout, UDP port added",
		"web/dns/udp/203.0.113.10 203.0.113.10:53 UDP affinity=3h0m0s [198.18.10.4:5353@198.18.1.2]",
		"web/http/tcp/203.0.113.10 203.0.113.10:80 TCP affinity=3h0m0s [198.18.10.1:8080@198.18.1.1(draining) 198.18.10.3:8080@198.18.10.3]")

	e.deleteSlice("web-2")
	e.deleteSlice("web-3")
	e.expect("slices deleted",
		"web/dns/udp/203.0.113.10 203.0.113.10:53 UDP affinity=3h0m0s []",
		"web/http/tcp/203.0.113.10 203.0.113.10:80 TCP affinity=3h0m0s [198.18.10.1:8080@198.18.1.1]")

	e.deleteService("web")
	e.expect("service deleted")
}

// TestNodeAddressChange checks that a Node's new InternalIP reaches its backends.
func TestNodeAddressChange(t *testing.T) {
	e := newEnv(t)
	n1 := "n1-" + e.ns
	e.createNode(n1, "198.18.1.1")
	e.startAdapter(e.config(), "a1")
	e.createService("web", corev1.ServiceTypeClusterIP, func(s *corev1.Service) { s.Spec.ExternalIPs = []string{"203.0.113.20"} })
	e.putSlice("web-1", "web", "http", 8080, ready("198.18.10.1", n1))
	e.expect("node address", "web/http/tcp/203.0.113.20 203.0.113.20:80 TCP [198.18.10.1:8080@198.18.1.1]")

	node, err := e.kube.CoreV1().Nodes().Get(e.ctx, n1, metav1GetOptions)
	if err != nil {
		t.Fatalf("get node: %v", err)
	}
	node.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "198.18.1.99"}}
	if _, err := e.kube.CoreV1().Nodes().UpdateStatus(e.ctx, node, metav1UpdateOptions); err != nil {
		t.Fatalf("update node: %v", err)
	}
	e.expect("node address changed", "web/http/tcp/203.0.113.20 203.0.113.20:80 TCP [198.18.10.1:8080@198.18.1.99]")
}

// TestDualStack serves an IPv4 and an IPv6 VIP of one Service, each from the slices and
// node address of its family.
func TestDualStack(t *testing.T) {
	e := newEnv(t)
	n1 := "n1-" + e.ns
	e.createNode(n1, "198.18.1.1", "2001:db8:1::1")
	e.startAdapter(e.config(), "a1")
	e.createService("web", corev1.ServiceTypeClusterIP, func(s *corev1.Service) {
		s.Spec.ExternalIPs = []string{"203.0.113.100", "2001:db8:ff::100"}
	})
	e.putSlice("web-4", "web", "http", 8080, ready("198.18.10.1", n1))
	e.putSlice("web-6", "web", "http", 8080, ready("2001:db8:10::1", n1))
	e.expect("both families",
		"web/http/tcp/2001:db8:ff::100 2001:db8:ff::100:80 TCP [2001:db8:10::1:8080@2001:db8:1::1]",
		"web/http/tcp/203.0.113.100 203.0.113.100:80 TCP [198.18.10.1:8080@198.18.1.1]")
}

// TestFiltering checks which Services are ours: by type, headless-ness, the
// service-proxy-name label and spec.loadBalancerClass.
func TestFiltering(t *testing.T) {
	e := newEnv(t)
	e.startAdapter(e.config(), "a1")
	other := "example.com/other"
	ours := testClass
	e.createService("classless", corev1.ServiceTypeLoadBalancer)
	e.createService("our-class", corev1.ServiceTypeLoadBalancer, func(s *corev1.Service) { s.Spec.LoadBalancerClass = &ours })
	e.createService("other-class", corev1.ServiceTypeLoadBalancer, func(s *corev1.Service) {
		s.Spec.LoadBalancerClass = &other
		s.Spec.ExternalIPs = []string{"203.0.113.33"}
	})
	e.createService("other-proxy", corev1.ServiceTypeLoadBalancer, func(s *corev1.Service) {
		s.Labels = map[string]string{translate.LabelServiceProxyName: "someone-else"}
	})
	e.createService("external", corev1.ServiceTypeClusterIP, func(s *corev1.Service) { s.Spec.ExternalIPs = []string{"203.0.113.35"} })
	e.createService("headless", corev1.ServiceTypeClusterIP, func(s *corev1.Service) {
		s.Spec.ClusterIP = corev1.ClusterIPNone
		s.Spec.ExternalIPs = []string{"203.0.113.36"}
	})
	e.createService("extname", corev1.ServiceTypeExternalName, func(s *corev1.Service) {
		s.Spec.ExternalName = "example.com"
		s.Spec.Ports = nil
	})
	e.setIngress("classless", "203.0.113.30")
	e.setIngress("our-class", "203.0.113.31")
	e.setIngress("other-class", "203.0.113.32")
	e.setIngress("other-proxy", "203.0.113.34")
	e.expect("only our Services",
		"classless/http/tcp/203.0.113.30 203.0.113.30:80 TCP []",
		"external/http/tcp/203.0.113.35 203.0.113.35:80 TCP []",
		"our-class/http/tcp/203.0.113.31 203.0.113.31:80 TCP []")

	e.updateService("other-proxy", func(s *corev1.Service) { s.Labels = nil })
	e.expect("label removed: the Service becomes ours",
		"classless/http/tcp/203.0.113.30 203.0.113.30:80 TCP []",
		"external/http/tcp/203.0.113.35 203.0.113.35:80 TCP []",
		"other-proxy/http/tcp/203.0.113.34 203.0.113.34:80 TCP []",
		"our-class/http/tcp/203.0.113.31 203.0.113.31:80 TCP []")
}

// TestClasslessNotClaimed runs an adapter configured to leave class-less Services alone.
func TestClasslessNotClaimed(t *testing.T) {
	e := newEnv(t)
	cfg := e.config()
	no := false
	cfg.ClaimClassless = &no
	e.startAdapter(cfg, "a1")
	ours := testClass
	e.createService("classless", corev1.ServiceTypeLoadBalancer)
	e.createService("our-class", corev1.ServiceTypeLoadBalancer, func(s *corev1.Service) { s.Spec.LoadBalancerClass = &ours })
	e.setIngress("classless", "203.0.113.30")
	e.setIngress("our-class", "203.0.113.31")
	e.expect("class-less Service ignored", "our-class/http/tcp/203.0.113.31 203.0.113.31:80 TCP []")
}

// TestAllocation allocates from a one-address pool: the first Service gets it, the second
// is told the pool is exhausted, and gets the address once the first is deleted.
func TestAllocation(t *testing.T) {
	e := newEnv(t)
	e.startAdapter(e.config(config.Pool{Name: "one", Addresses: []string{"203.0.113.40/32"}}), "a1")
	e.createService("first", corev1.ServiceTypeLoadBalancer)
	e.putSlice("first-1", "first", "http", 8080, ready("198.18.10.1", ""))
	e.eventually("first gets the address", func() (bool, string) {
		got := e.ingress("first")
		return slices.Equal(got, []string{"203.0.113.40"}), strings.Join(got, ",")
	})
	e.expect("lbd serves the allocated VIP", "first/http/tcp/203.0.113.40 203.0.113.40:80 TCP [198.18.10.1:8080@198.18.10.1]")

	// Created later, so it cannot take the address from the first.
	time.Sleep(1100 * time.Millisecond)
	e.createService("second", corev1.ServiceTypeLoadBalancer)
	e.putSlice("second-1", "second", "http", 8080, ready("198.18.10.2", ""))
	e.eventually("exhaustion is reported on second", func() (bool, string) {
		evs := e.events("second")
		return slices.ContainsFunc(evs, func(s string) bool { return strings.HasPrefix(s, "Warning AllocationFailed") }), strings.Join(evs, "; ")
	})
	if got := e.ingress("second"); len(got) != 0 {
		t.Fatalf("second got ingress %v from an exhausted pool", got)
	}
	e.expect("nothing for second", "first/http/tcp/203.0.113.40 203.0.113.40:80 TCP [198.18.10.1:8080@198.18.10.1]")

	e.deleteService("first")
	e.eventually("the released address goes to second", func() (bool, string) {
		got := e.ingress("second")
		return slices.Equal(got, []string{"203.0.113.40"}), strings.Join(got, ",")
	})
	e.expect("lbd serves second on the released VIP", "second/http/tcp/203.0.113.40 203.0.113.40:80 TCP [198.18.10.2:8080@198.18.10.2]")
	if evs := e.events("second"); !slices.ContainsFunc(evs, func(s string) bool { return strings.HasPrefix(s, "Normal IPAllocated") }) {
		t.Errorf("no IPAllocated event on second: %v", evs)
	}
}

// TestAllocationConflict gives two Services the same pool address by hand: the newer one
// is moved to another address and told why.
func TestAllocationConflict(t *testing.T) {
	e := newEnv(t)
	e.createService("old", corev1.ServiceTypeLoadBalancer)
	time.Sleep(1100 * time.Millisecond) // creation timestamps have a one-second resolution
	e.createService("new", corev1.ServiceTypeLoadBalancer)
	e.setIngress("old", "203.0.113.50")
	e.setIngress("new", "203.0.113.50")
	e.startAdapter(e.config(config.Pool{Name: "p", Addresses: []string{"203.0.113.50-203.0.113.51"}}), "a1")
	e.eventually("new is moved", func() (bool, string) {
		got := e.ingress("new")
		return slices.Equal(got, []string{"203.0.113.51"}), strings.Join(got, ",")
	})
	if got := e.ingress("old"); !slices.Equal(got, []string{"203.0.113.50"}) {
		t.Errorf("old has ingress %v, want it kept", got)
	}
	e.eventually("conflict event", func() (bool, string) {
		evs := e.events("new")
		return slices.ContainsFunc(evs, func(s string) bool { return strings.HasPrefix(s, "Warning IPConflict") }), strings.Join(evs, "; ")
	})
	e.expect("both served", "new/http/tcp/203.0.113.51 203.0.113.51:80 TCP []", "old/http/tcp/203.0.113.50 203.0.113.50:80 TCP []")
}

// TestLeaderHandover runs two adapters: only one allocates at a time, and the other takes
// over when it stops.
func TestLeaderHandover(t *testing.T) {
	e := newEnv(t)
	pool := config.Pool{Name: "p", Addresses: []string{"203.0.113.60/30"}}
	a1 := e.startAdapter(e.config(pool), "a1")
	e.createService("s1", corev1.ServiceTypeLoadBalancer)
	e.eventually("s1 allocated", func() (bool, string) {
		got := e.ingress("s1")
		return len(got) == 1, strings.Join(got, ",")
	})
	e.startAdapter(e.config(pool), "a2")
	a1.stop()
	e.createService("s2", corev1.ServiceTypeLoadBalancer)
	e.eventually("s2 allocated by the new leader", func() (bool, string) {
		got := e.ingress("s2")
		return len(got) == 1 && got[0] != e.ingress("s1")[0], strings.Join(got, ",")
	})
	lease, err := e.kube.CoordinationV1().Leases(e.ns).Get(e.ctx, "lbd-k8s-adapter", metav1GetOptions)
	if err != nil || lease.Spec.HolderIdentity == nil || *lease.Spec.HolderIdentity != "a2" {
		t.Errorf("lease = %v, %v; want held by a2", lease, err)
	}
}

// TestAdapterRestart changes the cluster while no adapter runs: a new one converges.
func TestAdapterRestart(t *testing.T) {
	e := newEnv(t)
	a := e.startAdapter(e.config(), "a1")
	e.createService("keep", corev1.ServiceTypeClusterIP, func(s *corev1.Service) { s.Spec.ExternalIPs = []string{"203.0.113.70"} })
	e.createService("gone", corev1.ServiceTypeClusterIP, func(s *corev1.Service) { s.Spec.ExternalIPs = []string{"203.0.113.71"} })
	e.putSlice("keep-1", "keep", "http", 8080, ready("198.18.10.1", ""))
	e.expect("before the restart",
		"gone/http/tcp/203.0.113.71 203.0.113.71:80 TCP []",
		"keep/http/tcp/203.0.113.70 203.0.113.70:80 TCP [198.18.10.1:8080@198.18.10.1]")
	a.stop()

	e.deleteService("gone")
	e.createService("new", corev1.ServiceTypeClusterIP, func(s *corev1.Service) { s.Spec.ExternalIPs = []string{"203.0.113.72"} })
	e.putSlice("keep-1", "keep", "http", 8080, ready("198.18.10.1", ""), ready("198.18.10.2", ""))
	// Nothing changes in lbd while no adapter runs.
	time.Sleep(300 * time.Millisecond)
	e.expect("adapter down",
		"gone/http/tcp/203.0.113.71 203.0.113.71:80 TCP []",
		"keep/http/tcp/203.0.113.70 203.0.113.70:80 TCP [198.18.10.1:8080@198.18.10.1]")

	e.startAdapter(e.config(), "a2")
	e.expect("after the restart",
		"keep/http/tcp/203.0.113.70 203.0.113.70:80 TCP [198.18.10.1:8080@198.18.10.1 198.18.10.2:8080@198.18.10.2]",
		"new/http/tcp/203.0.113.72 203.0.113.72:80 TCP []")
}

// TestLbdRestart stops lbd, changes the cluster, and starts an lbd that lost its state:
// the adapter survives the outage and reprograms lbd as soon as it is back.
func TestLbdRestart(t *testing.T) {
	e := newEnv(t)
	a := e.startAdapter(e.config(), "a1")
	e.createService("web", corev1.ServiceTypeClusterIP, func(s *corev1.Service) { s.Spec.ExternalIPs = []string{"203.0.113.80"} })
	e.putSlice("web-1", "web", "http", 8080, ready("198.18.10.1", ""))
	e.expect("before", "web/http/tcp/203.0.113.80 203.0.113.80:80 TCP [198.18.10.1:8080@198.18.10.1]")

	e.lbd.stop()
	e.putSlice("web-1", "web", "http", 8080, ready("198.18.10.1", ""), ready("198.18.10.2", ""))
	e.createService("api", corev1.ServiceTypeClusterIP, func(s *corev1.Service) { s.Spec.ExternalIPs = []string{"203.0.113.81"} })
	time.Sleep(2 * time.Second) // several failed syncs
	a.running(t)

	e.lbd.start()
	e.expect("after lbd restarted with an empty state",
		"api/http/tcp/203.0.113.81 203.0.113.81:80 TCP []",
		"web/http/tcp/203.0.113.80 203.0.113.80:80 TCP [198.18.10.1:8080@198.18.10.1 198.18.10.2:8080@198.18.10.2]")

	// A restart while the adapter is idle: no apply fails, so only noticing the reconnection
	// can bring the state back (the periodic resync is a minute away). The pause lets the
	// applies that the last changes caused finish first.
	time.Sleep(500 * time.Millisecond)
	e.lbd.stop()
	e.lbd.start()
	e.expect("after an idle restart",
		"api/http/tcp/203.0.113.81 203.0.113.81:80 TCP []",
		"web/http/tcp/203.0.113.80 203.0.113.80:80 TCP [198.18.10.1:8080@198.18.10.1 198.18.10.2:8080@198.18.10.2]")

	// An operator deleting the adapter's service by hand is repaired too.
	if _, err := e.lbd.client.DeleteService(e.ctx, deleteReq(e.ns+"/api/http/tcp/203.0.113.81")); err != nil {
		t.Fatalf("delete lbd service: %v", err)
	}
	e.expect("drift repaired",
		"api/http/tcp/203.0.113.81 203.0.113.81:80 TCP []",
		"web/http/tcp/203.0.113.80 203.0.113.80:80 TCP [198.18.10.1:8080@198.18.10.1 198.18.10.2:8080@198.18.10.2]")
}

// TestForeignFrontend checks that a frontend held by another lbd owner costs only the
// clashing Service, which is told why, and not the whole apply.
func TestForeignFrontend(t *testing.T) {
	e := newEnv(t)
	if _, err := e.lbd.client.CreateService(e.ctx, createReq("operator-web", "203.0.113.90")); err != nil {
		t.Fatalf("create operator service: %v", err)
	}
	e.startAdapter(e.config(), "a1")
	e.createService("clash", corev1.ServiceTypeClusterIP, func(s *corev1.Service) { s.Spec.ExternalIPs = []string{"203.0.113.90"} })
	e.createService("fine", corev1.ServiceTypeClusterIP, func(s *corev1.Service) { s.Spec.ExternalIPs = []string{"203.0.113.91"} })
	e.expect("the clashing Service is left out", "fine/http/tcp/203.0.113.91 203.0.113.91:80 TCP []")
	e.eventually("conflict event", func() (bool, string) {
		evs := e.events("clash")
		return slices.ContainsFunc(evs, func(s string) bool {
			return strings.HasPrefix(s, "Warning FrontendConflict") && strings.Contains(s, "operator-web")
		}), strings.Join(evs, "; ")
	})
}

// TestStatusConditionsAndEvents follows one Service from creation to being served and
// checks what `kubectl describe svc` and its conditions tell the operator.
func TestStatusConditionsAndEvents(t *testing.T) {
	e := newEnv(t)
	e.startAdapter(e.config(config.Pool{Name: "p", Addresses: []string{"203.0.113.120/30"}}), "a1")
	e.createService("web", corev1.ServiceTypeLoadBalancer)
	e.putSlice("web-1", "web", "http", 8080, ready("198.18.10.1", ""))
	e.eventually("conditions", func() (bool, string) {
		got := e.conditions("web")
		want := []string{
			"lbd-dev.github.io/Accepted=True Accepted: every port, VIP and endpoint is served as asked",
			"lbd-dev.github.io/IPAllocated=True IPAllocated: assigned 203.0.113.120",
			"lbd-dev.github.io/Programmed=True Programmed: lbd on a1 has programmed 1 VIP × port: http/tcp/203.0.113.120",
		}
		return strings.Join(got, "\n") == strings.Join(want, "\n"), strings.Join(got, "; ")
	})
	e.eventually("events", func() (bool, string) {
		evs := e.events("web")
		return slices.Contains(evs, "Normal IPAllocated: assigned 203.0.113.120") &&
			slices.Contains(evs, "Normal Programmed: lbd on a1 serves http/tcp/203.0.113.120"), strings.Join(evs, "; ")
	})
	out := e.kubectl("describe", "service", "web")
	for _, want := range []string{"IPAllocated", "assigned 203.0.113.120", "Programmed", "lbd on a1 serves http/tcp/203.0.113.120"} {
		if !strings.Contains(out, want) {
			t.Errorf("kubectl describe service web does not say %q:\n%s", want, out)
		}
	}
}
