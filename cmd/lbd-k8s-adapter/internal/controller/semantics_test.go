package controller_test

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/lbd-dev/lbd/cmd/lbd-k8s-adapter/internal/config"
	"github.com/lbd-dev/lbd/cmd/lbd-k8s-adapter/internal/controller"
	"github.com/lbd-dev/lbd/daemon/store"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
)

// hasEvent reports whether a Service has an Event starting with prefix ("Type Reason:
// message").
func (e *env) hasEvent(name, prefix string) (bool, string) {
	evs := e.events(name)
	return slices.ContainsFunc(evs, func(s string) bool { return strings.HasPrefix(s, prefix) }), strings.Join(evs, "; ")
}

// ingressIs waits until a Service's status holds exactly ips.
func (e *env) ingressIs(name string, ips ...string) {
	e.t.Helper()
	e.eventually(name+" has ingress "+strings.Join(ips, ","), func() (bool, string) {
		got := e.ingress(name)
		return slices.Equal(got, ips), strings.Join(got, ",")
	})
}

// watchIngress records every status.loadBalancer.ingress a Service goes through, as its
// clients would see it, until the test ends.
func (e *env) watchIngress(name string) func() []string {
	e.t.Helper()
	w, err := e.kube.CoreV1().Services(e.ns).Watch(e.ctx, metav1.ListOptions{FieldSelector: "metadata.name=" + name})
	if err != nil {
		e.t.Fatalf("watch service %s: %v", name, err)
	}
	e.t.Cleanup(w.Stop)
	seen := make(chan []string, 1)
	seen <- nil
	go func() {
		for ev := range w.ResultChan() {
			s, ok := ev.Object.(*corev1.Service)
			if !ok || ev.Type == watch.Deleted {
				continue
			}
			var ips []string
			for _, ing := range s.Status.LoadBalancer.Ingress {
				ips = append(ips, ing.IP)
			}
			all := <-seen
			if len(all) == 0 || all[len(all)-1] != strings.Join(ips, ",") {
				all = append(all, strings.Join(ips, ","))
			}
			seen <- all
		}
	}()
	return func() []string {
		all := <-seen
		seen <- all
		return slices.Clone(all)
	}
}

// TestRequestedIPChange changes spec.loadBalancerIP of a served Service, then the
// adapter's annotation: each time status and lbd move to the new address, the old one is
// kept until lbd has programmed the new one, then released for another Service.
func TestRequestedIPChange(t *testing.T) {
	e := newEnv(t)
	e.startAdapter(e.config(config.Pool{Name: "p", Addresses: []string{"203.0.113.140/30"}}), "a1")
	e.createService("web", corev1.ServiceTypeLoadBalancer, func(s *corev1.Service) { s.Spec.LoadBalancerIP = "203.0.113.141" })
	e.putSlice("web-1", "web", "http", 8080, ready("198.18.10.1", ""))
	e.ingressIs("web", "203.0.113.141")
	e.expect("the requested IP", "web/http/tcp/203.0.113.141 203.0.113.141:80 TCP [198.18.10.1:8080@198.18.10.1]")

	seen := e.watchIngress("web")
	start := time.Now()
	e.updateService("web", func(s *corev1.Service) { s.Spec.LoadBalancerIP = "203.0.113.142" })
	e.ingressIs("web", "203.0.113.142")
	e.expect("moved to the new IP", "web/http/tcp/203.0.113.142 203.0.113.142:80 TCP [198.18.10.1:8080@198.18.10.1]")
	t.Logf("spec.loadBalancerIP changed: status and lbd hold only the new IP %v later", time.Since(start).Round(time.Millisecond))
	if got := seen(); !slices.Contains(got, "203.0.113.142,203.0.113.141") || got[len(got)-1] != "203.0.113.142" {
		t.Errorf("ingress went through %q; want both addresses before the new one alone", got)
	}
	for _, ev := range []string{"Normal IPMoving: moving from 203.0.113.141 to the requested 203.0.113.142",
		"Normal IPReleased: released 203.0.113.141: the requested 203.0.113.142 is programmed"} {
		// The recorder writes Events in the background: they may trail the status.
		e.eventually("Event "+ev, func() (bool, string) { return e.hasEvent("web", ev) })
	}

	// The old address is free: a new Service asking for it gets it.
	e.createService("other", corev1.ServiceTypeLoadBalancer, func(s *corev1.Service) { s.Spec.LoadBalancerIP = "203.0.113.141" })
	e.ingressIs("other", "203.0.113.141")

	// The annotation takes precedence over spec.loadBalancerIP.
	e.updateService("web", func(s *corev1.Service) {
		s.Annotations = map[string]string{controller.AnnotationIPs: "203.0.113.143"}
	})
	e.ingressIs("web", "203.0.113.143")
	e.expect("moved by the annotation",
		"other/http/tcp/203.0.113.141 203.0.113.141:80 TCP []",
		"web/http/tcp/203.0.113.143 203.0.113.143:80 TCP [198.18.10.1:8080@198.18.10.1]")

	// An address another Service holds is refused; the Service keeps the one it has.
	e.updateService("web", func(s *corev1.Service) {
		s.Annotations = map[string]string{controller.AnnotationIPs: "203.0.113.141"}
	})
	e.eventually("conflict reported", func() (bool, string) {
		return e.hasEvent("web", "Warning IPConflict: requested IP 203.0.113.141 is already assigned to Service "+e.ns+"/other")
	})
	if got := e.ingress("web"); !slices.Equal(got, []string{"203.0.113.143"}) {
		t.Errorf("web has ingress %v after asking for a taken address, want it kept at 203.0.113.143", got)
	}
}

// TestRequireDualStack gives a RequireDualStack Service no address while one family's
// pool is exhausted, says why in its condition, and both once the family is free.
func TestRequireDualStack(t *testing.T) {
	e := newEnv(t)
	e.startAdapter(e.config(config.Pool{Name: "p", Addresses: []string{"203.0.113.150/32", "2001:db8:ff::150/128"}}), "a1")
	single := corev1.IPFamilyPolicySingleStack
	e.createService("v6", corev1.ServiceTypeLoadBalancer, func(s *corev1.Service) {
		s.Spec.IPFamilyPolicy = &single
		s.Spec.IPFamilies = []corev1.IPFamily{corev1.IPv6Protocol}
	})
	e.ingressIs("v6", "2001:db8:ff::150")

	time.Sleep(1100 * time.Millisecond) // creation timestamps have a one-second resolution
	require := corev1.IPFamilyPolicyRequireDualStack
	e.createService("dual", corev1.ServiceTypeLoadBalancer, func(s *corev1.Service) {
		s.Spec.IPFamilyPolicy = &require
		s.Spec.IPFamilies = []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol}
	})
	want := "lbd-dev.github.io/IPAllocated=False DualStackIncomplete: ipFamilyPolicy RequireDualStack: no free IPv6 address in pools [p]; no address of either family is assigned until both can be"
	e.eventually("the condition says why", func() (bool, string) {
		got := e.conditions("dual")
		return slices.Contains(got, want), strings.Join(got, "; ")
	})
	if got := e.ingress("dual"); len(got) != 0 {
		t.Errorf("dual has ingress %v with its IPv6 pool exhausted, want none", got)
	}
	e.eventually("a DualStackIncomplete Event", func() (bool, string) { return e.hasEvent("dual", "Warning DualStackIncomplete") })
	// The IPv4 address was not taken either: a single-stack Service gets it.
	e.createService("v4", corev1.ServiceTypeLoadBalancer)
	e.ingressIs("v4", "203.0.113.150")

	e.deleteService("v6")
	e.deleteService("v4")
	e.ingressIs("dual", "203.0.113.150", "2001:db8:ff::150")
	e.eventually("the condition turns true", func() (bool, string) {
		got := e.conditions("dual")
		return slices.Contains(got, "lbd-dev.github.io/IPAllocated=True IPAllocated: assigned 203.0.113.150, 2001:db8:ff::150"), strings.Join(got, "; ")
	})
}

// TestExternalIPsOffByDefault runs the adapter with its default configuration: no
// external IP is served, and a LoadBalancer Service of ours is told why.
func TestExternalIPsOffByDefault(t *testing.T) {
	e := newEnv(t)
	cfg := e.config()
	cfg.ExternalIPs = nil
	data, err := yamlConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if cfg, err = config.Parse(data); err != nil {
		t.Fatal(err)
	}
	e.startAdapter(cfg, "a1")
	e.createService("cip", corev1.ServiceTypeClusterIP, func(s *corev1.Service) { s.Spec.ExternalIPs = []string{"203.0.113.160"} })
	e.createService("lb", corev1.ServiceTypeLoadBalancer, func(s *corev1.Service) { s.Spec.ExternalIPs = []string{"203.0.113.162"} })
	e.setIngress("lb", "203.0.113.161")
	e.expect("only the ingress IP", "lb/http/tcp/203.0.113.161 203.0.113.161:80 TCP []")
	e.eventually("the LoadBalancer Service is told", func() (bool, string) {
		return e.hasEvent("lb", "Warning ExternalIPsDisabled: spec.externalIPs[0]: 203.0.113.162 not served")
	})
}

// TestExternalIPOutsidePools enables external IPs: one outside every pool is not
// programmed and its Service is told why (CVE-2020-8554); one inside a pool is served.
func TestExternalIPOutsidePools(t *testing.T) {
	e := newEnv(t)
	e.startAdapter(e.config(), "a1")
	e.createService("outside", corev1.ServiceTypeClusterIP, func(s *corev1.Service) { s.Spec.ExternalIPs = []string{"198.51.100.7"} })
	e.createService("inside", corev1.ServiceTypeClusterIP, func(s *corev1.Service) { s.Spec.ExternalIPs = []string{"203.0.113.163"} })
	e.expect("only the external IP inside a pool", "inside/http/tcp/203.0.113.163 203.0.113.163:80 TCP []")
	e.eventually("the Event says why", func() (bool, string) {
		return e.hasEvent("outside", "Warning ExternalIPNotAllowed: spec.externalIPs[0]: 198.51.100.7 not served: it is in no address pool")
	})
}

// TestBadEndpointIsolated puts a multicast endpoint into one Service's slice and, in the
// same second, changes another Service: the bad endpoint is left out with an Event and a
// condition, and both changes reach lbd.
func TestBadEndpointIsolated(t *testing.T) {
	e := newEnv(t)
	e.startAdapter(e.config(), "a1")
	e.createService("a", corev1.ServiceTypeLoadBalancer)
	e.createService("b", corev1.ServiceTypeLoadBalancer)
	e.setIngress("a", "203.0.113.170")
	e.setIngress("b", "203.0.113.171")
	e.putSlice("a-1", "a", "http", 8080, ready("198.18.10.1", ""))
	e.putSlice("b-1", "b", "http", 8080, ready("198.18.10.2", ""))
	e.expect("before",
		"a/http/tcp/203.0.113.170 203.0.113.170:80 TCP [198.18.10.1:8080@198.18.10.1]",
		"b/http/tcp/203.0.113.171 203.0.113.171:80 TCP [198.18.10.2:8080@198.18.10.2]")

	start := time.Now()
	e.putSlice("a-1", "a", "http", 8080, ready("198.18.10.1", ""), ready("239.1.2.3", ""), ready("198.18.10.4", ""))
	e.putSlice("b-1", "b", "http", 8080, ready("198.18.10.2", ""), ready("198.18.10.3", ""))
	if d := time.Since(start); d >= time.Second {
		t.Fatalf("the two changes took %v, want them within a second", d)
	}
	e.expect("both changes applied, the multicast endpoint left out",
		"a/http/tcp/203.0.113.170 203.0.113.170:80 TCP [198.18.10.1:8080@198.18.10.1 198.18.10.4:8080@198.18.10.4]",
		"b/http/tcp/203.0.113.171 203.0.113.171:80 TCP [198.18.10.2:8080@198.18.10.2 198.18.10.3:8080@198.18.10.3]")
	msg := "EndpointSlice a-1: endpoints[1].addresses[0] 239.1.2.3 is a multicast address: left out"
	e.eventually("Event", func() (bool, string) { return e.hasEvent("a", "Warning InvalidEndpoint: "+msg) })
	e.eventually("condition", func() (bool, string) {
		got := e.conditions("a")
		return slices.Contains(got, "lbd-dev.github.io/Accepted=False InvalidEndpoint: InvalidEndpoint: "+msg), strings.Join(got, "; ")
	})
}

// TestRejectedByLbdIsolated gives lbd a lower per-service backend limit than the
// adapter's: lbd refuses the Service with too many endpoints, which is left out with an
// Event, and every other Service keeps being applied.
func TestRejectedByLbdIsolated(t *testing.T) {
	lim := store.DefaultLimits()
	lim.MaxBackendsPerService = 2
	e := newEnvLimits(t, lim)
	e.startAdapter(e.config(), "a1")
	e.createService("big", corev1.ServiceTypeLoadBalancer)
	e.createService("small", corev1.ServiceTypeLoadBalancer)
	e.setIngress("big", "203.0.113.180")
	e.setIngress("small", "203.0.113.181")
	e.putSlice("big-1", "big", "http", 8080, ready("198.18.10.1", ""), ready("198.18.10.2", ""), ready("198.18.10.3", ""))
	e.putSlice("small-1", "small", "http", 8080, ready("198.18.10.4", ""))
	e.expect("the refused Service is left out", "small/http/tcp/203.0.113.181 203.0.113.181:80 TCP [198.18.10.4:8080@198.18.10.4]")
	e.eventually("Event", func() (bool, string) {
		return e.hasEvent("big", "Warning RejectedByLbd: lbd service "+e.ns+"/big/http/tcp/203.0.113.180 left out: lbd says backends: 3 backends exceed the limit of 2 per service")
	})
	e.putSlice("small-1", "small", "http", 8080, ready("198.18.10.4", ""), ready("198.18.10.5", ""))
	e.expect("later changes still applied", "small/http/tcp/203.0.113.181 203.0.113.181:80 TCP [198.18.10.4:8080@198.18.10.4 198.18.10.5:8080@198.18.10.5]")
	e.putSlice("big-1", "big", "http", 8080, ready("198.18.10.1", ""), ready("198.18.10.2", ""))
	e.expect("the Service fixed: applied",
		"big/http/tcp/203.0.113.180 203.0.113.180:80 TCP [198.18.10.1:8080@198.18.10.1 198.18.10.2:8080@198.18.10.2]",
		"small/http/tcp/203.0.113.181 203.0.113.181:80 TCP [198.18.10.4:8080@198.18.10.4 198.18.10.5:8080@198.18.10.5]")
}

// TestExternalTrafficPolicyLocal serves a Local Service only from endpoints on a known
// node, and every endpoint once it is Cluster again.
func TestExternalTrafficPolicyLocal(t *testing.T) {
	e := newEnv(t)
	n1 := "n1-" + e.ns
	e.createNode(n1, "198.18.1.1")
	e.startAdapter(e.config(), "a1")
	e.createService("web", corev1.ServiceTypeLoadBalancer, func(s *corev1.Service) {
		s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
	})
	e.setIngress("web", "203.0.113.190")
	e.putSlice("web-1", "web", "http", 8080, ready("198.18.10.1", n1), ready("198.18.10.2", ""))
	e.expect("Local: only the endpoint on a known node", "web/http/tcp/203.0.113.190 203.0.113.190:80 TCP [198.18.10.1:8080@198.18.1.1]")
	e.eventually("Event", func() (bool, string) { return e.hasEvent("web", "Warning EndpointNodeUnknown") })
	e.updateService("web", func(s *corev1.Service) { s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyCluster })
	e.expect("Cluster: every endpoint", "web/http/tcp/203.0.113.190 203.0.113.190:80 TCP [198.18.10.1:8080@198.18.1.1 198.18.10.2:8080@198.18.10.2]")
}
