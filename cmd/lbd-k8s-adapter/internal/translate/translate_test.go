package translate

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

const testClass = "lbd-dev.github.io/lbd"

var defaultOpts = Options{LoadBalancerClass: testClass, ClaimClassless: true, ExternalIPs: true, ExternalIPPool: testPool}

// testPool is the adapter's pools as translation sees them: 203.0.113.0/24 and
// 2001:db8:ff::/48.
func testPool(a netip.Addr) string {
	for _, p := range []string{"203.0.113.0/24", "2001:db8:ff::/48"} {
		if netip.MustParsePrefix(p).Contains(a) {
			return "test"
		}
	}
	return ""
}

// svcOpt edits a test Service.
type svcOpt func(*corev1.Service)

// lbService is a LoadBalancer Service "ns1/web" with port http 80/TCP and the given
// ingress IPs, changed by opts.
func lbService(ingress []string, opts ...svcOpt) *corev1.Service {
	s := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns1", Name: "web"},
		Spec: corev1.ServiceSpec{
			Type:      corev1.ServiceTypeLoadBalancer,
			ClusterIP: "10.0.0.10",
			Ports:     []corev1.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP}},
		},
	}
	for _, ip := range ingress {
		s.Status.LoadBalancer.Ingress = append(s.Status.LoadBalancer.Ingress, corev1.LoadBalancerIngress{IP: ip})
	}
	for _, o := range opts {
		o(s)
	}
	return s
}

func withType(t corev1.ServiceType) svcOpt { return func(s *corev1.Service) { s.Spec.Type = t } }
func withClass(c string) svcOpt            { return func(s *corev1.Service) { s.Spec.LoadBalancerClass = &c } }
func withPorts(p ...corev1.ServicePort) svcOpt {
	return func(s *corev1.Service) { s.Spec.Ports = p }
}
func withExternalIPs(ips ...string) svcOpt {
	return func(s *corev1.Service) { s.Spec.ExternalIPs = ips }
}
func withLabel(k, v string) svcOpt {
	return func(s *corev1.Service) { s.Labels = map[string]string{k: v} }
}
func withRanges(r ...string) svcOpt {
	return func(s *corev1.Service) { s.Spec.LoadBalancerSourceRanges = r }
}

// ep is a test endpoint: address, node, and conditions (nil = unset).
type ep struct {
	addr                        string
	node                        string
	ready, serving, terminating *bool
}

func bp(b bool) *bool { return &b }

func readyEP(addr, node string) ep {
	return ep{addr: addr, node: node, ready: bp(true), serving: bp(true), terminating: bp(false)}
}
func notReadyEP(addr, node string) ep {
	return ep{addr: addr, node: node, ready: bp(false), serving: bp(false), terminating: bp(false)}
}
func termEP(addr, node string, serving bool) ep {
	return ep{addr: addr, node: node, ready: bp(false), serving: bp(serving), terminating: bp(true)}
}

// slice is an EndpointSlice of ns1/web with one port (name, proto, number).
func slice(name string, at discoveryv1.AddressType, portName string, proto corev1.Protocol, port int32, eps ...ep) *discoveryv1.EndpointSlice {
	s := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: "ns1", Name: name, Labels: map[string]string{discoveryv1.LabelServiceName: "web"}},
		AddressType: at,
		Ports:       []discoveryv1.EndpointPort{{Name: &portName, Protocol: &proto, Port: &port}},
	}
	for _, e := range eps {
		e := e
		d := discoveryv1.Endpoint{Addresses: []string{e.addr}, Conditions: discoveryv1.EndpointConditions{Ready: e.ready, Serving: e.serving, Terminating: e.terminating}}
		if e.node != "" {
			d.NodeName = &e.node
		}
		s.Endpoints = append(s.Endpoints, d)
	}
	return s
}

var testNodes = NodeAddresses{
	"n1":  {netip.MustParseAddr("198.18.1.1"), netip.MustParseAddr("2001:db8:1::1")},
	"n2":  {netip.MustParseAddr("198.18.1.2")},
	"bad": {netip.MustParseAddr("224.0.0.1")},
}

// render writes a service compactly so tables can state whole expected outputs.
func render(s *lbdv1.Service) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s:%d %s", s.Name, s.Vip, s.Port, strings.TrimPrefix(s.Protocol.String(), "PROTOCOL_"))
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

func renderAll(ss []*lbdv1.Service) []string {
	out := []string{}
	for _, s := range ss {
		out = append(out, render(s))
	}
	return out
}

func reasons(ps []Problem) []string {
	out := []string{}
	for _, p := range ps {
		out = append(out, p.Reason)
	}
	return out
}

type translateCase struct {
	name     string
	svc      *corev1.Service
	slices   []*discoveryv1.EndpointSlice
	opts     *Options
	want     []string
	problems []string
}

var v4ready = slice("web-a", discoveryv1.AddressTypeIPv4, "http", corev1.ProtocolTCP, 8080,
	readyEP("198.18.10.1", "n1"), readyEP("198.18.10.2", "n2"))

func translateCases() []translateCase {
	classless := defaultOpts
	classless.ClaimClassless = false
	noExternal := defaultOpts
	noExternal.ExternalIPs = false
	ourProxy := defaultOpts
	ourProxy.ServiceProxyName = "lbd"
	capped := defaultOpts
	capped.MaxBackendsPerService = 1
	return []translateCase{
		{
			name:   "ingress IP: one service per VIP and port, named ns/svc/port/proto/vip",
			svc:    lbService([]string{"203.0.113.10"}),
			slices: []*discoveryv1.EndpointSlice{v4ready},
			want:   []string{"ns1/web/http/tcp/203.0.113.10 203.0.113.10:80 TCP [198.18.10.1:8080@198.18.1.1 198.18.10.2:8080@198.18.1.2]"},
		},
		{
			name:   "no ingress IP and no external IP: nothing",
			svc:    lbService(nil),
			slices: []*discoveryv1.EndpointSlice{v4ready},
			want:   []string{},
		},
		{
			name: "two VIPs × two ports",
			svc: lbService([]string{"203.0.113.10", "203.0.113.11"}, withPorts(
				corev1.ServicePort{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP},
				corev1.ServicePort{Name: "https", Port: 443, Protocol: corev1.ProtocolTCP})),
			slices: []*discoveryv1.EndpointSlice{v4ready},
			want: []string{
				"ns1/web/http/tcp/203.0.113.10 203.0.113.10:80 TCP [198.18.10.1:8080@198.18.1.1 198.18.10.2:8080@198.18.1.2]",
				"ns1/web/http/tcp/203.0.113.11 203.0.113.11:80 TCP [198.18.10.1:8080@198.18.1.1 198.18.10.2:8080@198.18.1.2]",
				"ns1/web/https/tcp/203.0.113.10 203.0.113.10:443 TCP []",
				"ns1/web/https/tcp/203.0.113.11 203.0.113.11:443 TCP []",
			},
		},
		{
			name: "ports matched by name and protocol: same number on TCP and UDP",
			svc: lbService([]string{"203.0.113.10"}, withPorts(
				corev1.ServicePort{Name: "dns", Port: 53, Protocol: corev1.ProtocolUDP},
				corev1.ServicePort{Name: "dns-tcp", Port: 53, Protocol: corev1.ProtocolTCP})),
			slices: []*discoveryv1.EndpointSlice{
				slice("a", discoveryv1.AddressTypeIPv4, "dns", corev1.ProtocolUDP, 5353, readyEP("198.18.10.1", "n1")),
				slice("b", discoveryv1.AddressTypeIPv4, "dns-tcp", corev1.ProtocolTCP, 5354, readyEP("198.18.10.2", "n2")),
				// Right name, wrong protocol: must not be used for the UDP port.
				slice("c", discoveryv1.AddressTypeIPv4, "dns", corev1.ProtocolTCP, 9999, readyEP("198.18.10.3", "n2")),
			},
			want: []string{
				"ns1/web/dns-tcp/tcp/203.0.113.10 203.0.113.10:53 TCP [198.18.10.2:5354@198.18.1.2]",
				"ns1/web/dns/udp/203.0.113.10 203.0.113.10:53 UDP [198.18.10.1:5353@198.18.1.1]",
			},
		},
		{
			name:   "unnamed port: named by number, matched to the unnamed slice port",
			svc:    lbService([]string{"203.0.113.10"}, withPorts(corev1.ServicePort{Port: 8443, Protocol: corev1.ProtocolTCP})),
			slices: []*discoveryv1.EndpointSlice{slice("a", discoveryv1.AddressTypeIPv4, "", corev1.ProtocolTCP, 443, readyEP("198.18.10.1", "n1")), v4ready},
			want:   []string{"ns1/web/8443/tcp/203.0.113.10 203.0.113.10:8443 TCP [198.18.10.1:443@198.18.1.1]"},
		},
		{
			name: "SCTP port is served on the Service's port",
			svc: lbService([]string{"203.0.113.10"}, withPorts(corev1.ServicePort{Name: "s1ap", Port: 36412, Protocol: corev1.ProtocolSCTP},
				corev1.ServicePort{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP})),
			slices: []*discoveryv1.EndpointSlice{v4ready,
				slice("s", discoveryv1.AddressTypeIPv4, "s1ap", corev1.ProtocolSCTP, 36412, readyEP("198.18.10.1", "n1"))},
			want: []string{
				"ns1/web/http/tcp/203.0.113.10 203.0.113.10:80 TCP [198.18.10.1:8080@198.18.1.1 198.18.10.2:8080@198.18.1.2]",
				"ns1/web/s1ap/sctp/203.0.113.10 203.0.113.10:36412 SCTP [198.18.10.1:36412@198.18.1.1]",
			},
		},
		{
			name: "SCTP port whose endpoints listen on another port is reported, other ports still served",
			svc: lbService([]string{"203.0.113.10"}, withPorts(corev1.ServicePort{Name: "s1ap", Port: 36412, Protocol: corev1.ProtocolSCTP},
				corev1.ServicePort{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP})),
			slices: []*discoveryv1.EndpointSlice{v4ready,
				slice("s", discoveryv1.AddressTypeIPv4, "s1ap", corev1.ProtocolSCTP, 9000, readyEP("198.18.10.1", "n1"))},
			want:     []string{"ns1/web/http/tcp/203.0.113.10 203.0.113.10:80 TCP [198.18.10.1:8080@198.18.1.1 198.18.10.2:8080@198.18.1.2]"},
			problems: []string{"SCTPTargetPort"},
		},
		{
			name: "not-ready and terminating endpoints drain while ready ones exist",
			svc:  lbService([]string{"203.0.113.10"}),
			slices: []*discoveryv1.EndpointSlice{slice("a", discoveryv1.AddressTypeIPv4, "http", corev1.ProtocolTCP, 8080,
				readyEP("198.18.10.1", "n1"), notReadyEP("198.18.10.2", "n2"), termEP("198.18.10.3", "n2", true), termEP("198.18.10.4", "n2", false))},
			want: []string{"ns1/web/http/tcp/203.0.113.10 203.0.113.10:80 TCP [198.18.10.1:8080@198.18.1.1 198.18.10.2:8080@198.18.1.2(draining) 198.18.10.3:8080@198.18.1.2(draining) 198.18.10.4:8080@198.18.1.2(draining)]"},
		},
		{
			name: "no ready endpoint: serving terminating ones take new flows, the others drain",
			svc:  lbService([]string{"203.0.113.10"}),
			slices: []*discoveryv1.EndpointSlice{slice("a", discoveryv1.AddressTypeIPv4, "http", corev1.ProtocolTCP, 8080,
				notReadyEP("198.18.10.2", "n2"), termEP("198.18.10.3", "n2", true), termEP("198.18.10.4", "n2", false))},
			want: []string{"ns1/web/http/tcp/203.0.113.10 203.0.113.10:80 TCP [198.18.10.2:8080@198.18.1.2(draining) 198.18.10.3:8080@198.18.1.2 198.18.10.4:8080@198.18.1.2(draining)]"},
		},
		{
			name: "only not-ready endpoints: all drain, none takes new flows",
			svc:  lbService([]string{"203.0.113.10"}),
			slices: []*discoveryv1.EndpointSlice{slice("a", discoveryv1.AddressTypeIPv4, "http", corev1.ProtocolTCP, 8080,
				notReadyEP("198.18.10.2", "n2"))},
			want: []string{"ns1/web/http/tcp/203.0.113.10 203.0.113.10:80 TCP [198.18.10.2:8080@198.18.1.2(draining)]"},
		},
		{
			name: "endpoints lbd cannot use are left out, one problem per slice and reason; the others serve",
			svc:  lbService([]string{"203.0.113.10"}),
			slices: []*discoveryv1.EndpointSlice{slice("a", discoveryv1.AddressTypeIPv4, "http", corev1.ProtocolTCP, 8080,
				readyEP("198.18.10.1", "n1"), readyEP("239.1.2.3", "n1"), readyEP("169.254.0.7", "n1"), readyEP("0.0.0.0", "n1"),
				readyEP("255.255.255.255", ""), readyEP("127.0.0.1", ""), readyEP("2001:db8:10::1", "n1"), readyEP("nonsense", "n1"))},
			want:     []string{"ns1/web/http/tcp/203.0.113.10 203.0.113.10:80 TCP [198.18.10.1:8080@198.18.1.1]"},
			problems: []string{"InvalidEndpoint"},
		},
		{
			name: "a node whose InternalIP lbd cannot use: its endpoints are left out",
			svc:  lbService([]string{"203.0.113.10"}),
			slices: []*discoveryv1.EndpointSlice{slice("a", discoveryv1.AddressTypeIPv4, "http", corev1.ProtocolTCP, 8080,
				readyEP("198.18.10.1", "n1"), readyEP("198.18.10.2", "bad"))},
			want:     []string{"ns1/web/http/tcp/203.0.113.10 203.0.113.10:80 TCP [198.18.10.1:8080@198.18.1.1]"},
			problems: []string{"InvalidNodeAddress"},
		},
		{
			name: "externalTrafficPolicy Local: only endpoints on a known node",
			svc: lbService([]string{"203.0.113.10"}, func(s *corev1.Service) {
				s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
			}),
			slices: []*discoveryv1.EndpointSlice{slice("a", discoveryv1.AddressTypeIPv4, "http", corev1.ProtocolTCP, 8080,
				readyEP("198.18.10.1", "n2"), readyEP("198.18.10.2", "unknown-node"), readyEP("198.18.10.3", ""))},
			want:     []string{"ns1/web/http/tcp/203.0.113.10 203.0.113.10:80 TCP [198.18.10.1:8080@198.18.1.2]"},
			problems: []string{"EndpointNodeUnknown"},
		},
		{
			name: "externalTrafficPolicy Local: a node without an address of the family",
			svc: lbService([]string{"2001:db8:ff::10"}, func(s *corev1.Service) {
				s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
			}),
			slices: []*discoveryv1.EndpointSlice{slice("a", discoveryv1.AddressTypeIPv6, "http", corev1.ProtocolTCP, 8080,
				readyEP("2001:db8:10::1", "n1"), readyEP("2001:db8:10::2", "n2"))},
			want:     []string{"ns1/web/http/tcp/2001:db8:ff::10 2001:db8:ff::10:80 TCP [2001:db8:10::1:8080@2001:db8:1::1]"},
			problems: []string{"EndpointNodeUnknown"},
		},
		{
			name:   "unset conditions mean ready (EndpointSlice API)",
			svc:    lbService([]string{"203.0.113.10"}),
			slices: []*discoveryv1.EndpointSlice{slice("a", discoveryv1.AddressTypeIPv4, "http", corev1.ProtocolTCP, 8080, ep{addr: "198.18.10.1", node: "n1"})},
			want:   []string{"ns1/web/http/tcp/203.0.113.10 203.0.113.10:80 TCP [198.18.10.1:8080@198.18.1.1]"},
		},
		{
			name: "the same endpoint in two slices appears once, in its most usable state",
			svc:  lbService([]string{"203.0.113.10"}),
			slices: []*discoveryv1.EndpointSlice{
				slice("a", discoveryv1.AddressTypeIPv4, "http", corev1.ProtocolTCP, 8080, termEP("198.18.10.1", "n1", false)),
				slice("b", discoveryv1.AddressTypeIPv4, "http", corev1.ProtocolTCP, 8080, readyEP("198.18.10.1", "n1")),
			},
			want: []string{"ns1/web/http/tcp/203.0.113.10 203.0.113.10:80 TCP [198.18.10.1:8080@198.18.1.1]"},
		},
		{
			name: "node address: InternalIP of the node, else the endpoint address",
			svc:  lbService([]string{"203.0.113.10"}),
			slices: []*discoveryv1.EndpointSlice{slice("a", discoveryv1.AddressTypeIPv4, "http", corev1.ProtocolTCP, 8080,
				readyEP("198.18.10.1", "n2"), readyEP("198.18.10.2", "unknown-node"), readyEP("198.18.10.3", ""))},
			want: []string{"ns1/web/http/tcp/203.0.113.10 203.0.113.10:80 TCP [198.18.10.1:8080@198.18.1.2 198.18.10.2:8080@198.18.10.2 198.18.10.3:8080@198.18.10.3]"},
		},
		{
			name: "dual stack: each VIP takes the slices and node address of its family",
			svc:  lbService([]string{"203.0.113.10", "2001:db8:ff::10"}),
			slices: []*discoveryv1.EndpointSlice{v4ready,
				slice("web-6", discoveryv1.AddressTypeIPv6, "http", corev1.ProtocolTCP, 8080, readyEP("2001:db8:10::1", "n1"), readyEP("2001:db8:10::2", "n2"))},
			want: []string{
				"ns1/web/http/tcp/2001:db8:ff::10 2001:db8:ff::10:80 TCP [2001:db8:10::1:8080@2001:db8:1::1 2001:db8:10::2:8080@2001:db8:10::2]",
				"ns1/web/http/tcp/203.0.113.10 203.0.113.10:80 TCP [198.18.10.1:8080@198.18.1.1 198.18.10.2:8080@198.18.1.2]",
			},
		},
		{
			name:   "slices of another Service are ignored",
			svc:    lbService([]string{"203.0.113.10"}, func(s *corev1.Service) { s.Name = "other" }),
			slices: []*discoveryv1.EndpointSlice{v4ready},
			want:   []string{"ns1/other/http/tcp/203.0.113.10 203.0.113.10:80 TCP []"},
		},
		{
			name: "ClientIP affinity defaults to 10800 s",
			svc: lbService([]string{"203.0.113.10"}, func(s *corev1.Service) {
				s.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
			}),
			want: []string{"ns1/web/http/tcp/203.0.113.10 203.0.113.10:80 TCP affinity=3h0m0s []"},
		},
		{
			name: "ClientIP affinity with its timeout",
			svc: lbService([]string{"203.0.113.10"}, func(s *corev1.Service) {
				s.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
				secs := int32(600)
				s.Spec.SessionAffinityConfig = &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: &secs}}
			}),
			want: []string{"ns1/web/http/tcp/203.0.113.10 203.0.113.10:80 TCP affinity=10m0s []"},
		},
		{
			name: "source ranges per VIP family, masked and sorted; external IPs are not filtered",
			svc: lbService([]string{"203.0.113.10", "2001:db8:ff::10"}, withRanges("198.51.100.7/24", "2001:db8:aa::/48", "10.1.0.0/16"),
				withExternalIPs("203.0.113.20")),
			want: []string{
				"ns1/web/http/tcp/2001:db8:ff::10 2001:db8:ff::10:80 TCP ranges=2001:db8:aa::/48 []",
				"ns1/web/http/tcp/203.0.113.10 203.0.113.10:80 TCP ranges=10.1.0.0/16,198.51.100.0/24 []",
				"ns1/web/http/tcp/203.0.113.20 203.0.113.20:80 TCP []",
			},
		},
		{
			name: "source ranges from the legacy annotation when the field is empty",
			svc: lbService([]string{"203.0.113.10"}, func(s *corev1.Service) {
				s.Annotations = map[string]string{corev1.AnnotationLoadBalancerSourceRangesKey: "198.51.100.0/24, nonsense"}
			}),
			want:     []string{"ns1/web/http/tcp/203.0.113.10 203.0.113.10:80 TCP ranges=198.51.100.0/24 []"},
			problems: []string{"InvalidSourceRange"},
		},
		{
			name:     "ranges without the VIP's family: that VIP is not served (fail closed)",
			svc:      lbService([]string{"203.0.113.10", "2001:db8:ff::10"}, withRanges("198.51.100.0/24")),
			want:     []string{"ns1/web/http/tcp/203.0.113.10 203.0.113.10:80 TCP ranges=198.51.100.0/24 []"},
			problems: []string{"SourceRangesFamily"},
		},
		{
			name:   "externalIPs of a ClusterIP Service",
			svc:    lbService(nil, withType(corev1.ServiceTypeClusterIP), withExternalIPs("203.0.113.30")),
			slices: []*discoveryv1.EndpointSlice{v4ready},
			want:   []string{"ns1/web/http/tcp/203.0.113.30 203.0.113.30:80 TCP [198.18.10.1:8080@198.18.1.1 198.18.10.2:8080@198.18.1.2]"},
		},
		{
			name: "externalIPs of a ClusterIP Service, disabled in the config",
			svc:  lbService(nil, withType(corev1.ServiceTypeClusterIP), withExternalIPs("203.0.113.30")),
			opts: &noExternal,
			want: []string{},
		},
		{
			name:     "externalIPs of our LoadBalancer Service, disabled in the config: said why",
			svc:      lbService([]string{"203.0.113.10"}, withExternalIPs("203.0.113.30")),
			opts:     &noExternal,
			want:     []string{"ns1/web/http/tcp/203.0.113.10 203.0.113.10:80 TCP []"},
			problems: []string{"ExternalIPsDisabled"},
		},
		{
			name:     "externalIPs outside every pool are not served (CVE-2020-8554)",
			svc:      lbService(nil, withType(corev1.ServiceTypeClusterIP), withExternalIPs("198.51.100.7", "203.0.113.30")),
			want:     []string{"ns1/web/http/tcp/203.0.113.30 203.0.113.30:80 TCP []"},
			problems: []string{"ExternalIPNotAllowed"},
		},
		{
			name:     "an ingress IP lbd cannot use is reported",
			svc:      lbService([]string{"224.0.0.5", "203.0.113.10"}),
			want:     []string{"ns1/web/http/tcp/203.0.113.10 203.0.113.10:80 TCP []"},
			problems: []string{"InvalidVIP"},
		},
		{
			name: "an address both ingress and external IP appears once",
			svc:  lbService([]string{"203.0.113.10"}, withExternalIPs("203.0.113.10")),
			want: []string{"ns1/web/http/tcp/203.0.113.10 203.0.113.10:80 TCP []"},
		},
		{
			name: "ExternalName Service is ignored",
			svc:  lbService(nil, withType(corev1.ServiceTypeExternalName), withExternalIPs("203.0.113.30")),
			want: []string{},
		},
		{
			name: "headless Service is ignored",
			svc: lbService(nil, withType(corev1.ServiceTypeClusterIP), withExternalIPs("203.0.113.30"), func(s *corev1.Service) {
				s.Spec.ClusterIP = corev1.ClusterIPNone
			}),
			want: []string{},
		},
		{
			name: "labelled for another service proxy: ignored",
			svc:  lbService([]string{"203.0.113.10"}, withLabel(LabelServiceProxyName, "other-proxy")),
			want: []string{},
		},
		{
			name: "labelled for our service proxy: ours",
			svc:  lbService([]string{"203.0.113.10"}, withLabel(LabelServiceProxyName, "lbd")),
			opts: &ourProxy,
			want: []string{"ns1/web/http/tcp/203.0.113.10 203.0.113.10:80 TCP []"},
		},
		{
			name: "our loadBalancerClass",
			svc:  lbService([]string{"203.0.113.10"}, withClass(testClass)),
			opts: &classless,
			want: []string{"ns1/web/http/tcp/203.0.113.10 203.0.113.10:80 TCP []"},
		},
		{
			name: "another loadBalancerClass: neither ingress nor external IPs are ours",
			svc:  lbService([]string{"203.0.113.10"}, withClass("example.com/other"), withExternalIPs("203.0.113.30")),
			want: []string{},
		},
		{
			name: "class-less LoadBalancer Service, not claimed by the config",
			svc:  lbService([]string{"203.0.113.10"}),
			opts: &classless,
			want: []string{},
		},
		{
			name:     "invalid ingress IP is reported",
			svc:      lbService([]string{"not-an-ip", "203.0.113.10"}),
			want:     []string{"ns1/web/http/tcp/203.0.113.10 203.0.113.10:80 TCP []"},
			problems: []string{"InvalidVIP"},
		},
		{
			name:     "backends capped at lbd's per-service limit",
			svc:      lbService([]string{"203.0.113.10"}),
			slices:   []*discoveryv1.EndpointSlice{v4ready},
			opts:     &capped,
			want:     []string{"ns1/web/http/tcp/203.0.113.10 203.0.113.10:80 TCP [198.18.10.1:8080@198.18.1.1]"},
			problems: []string{"TooManyBackends"},
		},
	}
}

func TestService(t *testing.T) {
	for _, tc := range translateCases() {
		t.Run(tc.name, func(t *testing.T) {
			opts := defaultOpts
			if tc.opts != nil {
				opts = *tc.opts
			}
			res := Service(tc.svc, tc.slices, testNodes, opts)
			got := renderAll(res.Services)
			if strings.Join(got, "\n") != strings.Join(tc.want, "\n") {
				t.Errorf("services:\n got  %q\n want %q", got, tc.want)
			}
			wantProblems := tc.problems
			if wantProblems == nil {
				wantProblems = []string{}
			}
			if g := reasons(res.Problems); strings.Join(g, ",") != strings.Join(wantProblems, ",") {
				t.Errorf("problems: got %v (%v), want %v", g, res.Problems, wantProblems)
			}
		})
	}
}

func TestNodeInternalIPs(t *testing.T) {
	n := &corev1.Node{Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{
		{Type: corev1.NodeHostName, Address: "n1"},
		{Type: corev1.NodeExternalIP, Address: "203.0.113.99"},
		{Type: corev1.NodeInternalIP, Address: "198.18.1.1"},
		{Type: corev1.NodeInternalIP, Address: "2001:db8:1::1"},
	}}}
	got := fmt.Sprint(NodeInternalIPs(n))
	if want := "[198.18.1.1 2001:db8:1::1]"; got != want {
		t.Errorf("NodeInternalIPs = %s, want %s", got, want)
	}
}

func TestMerge(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	older := Service(lbService([]string{"203.0.113.10"}, func(s *corev1.Service) { s.Name = "old" }), nil, nil, defaultOpts)
	newer := Service(lbService([]string{"203.0.113.10", "203.0.113.11"}, func(s *corev1.Service) { s.Name = "new" }), nil, nil, defaultOpts)
	third := Service(lbService([]string{"203.0.113.12"}, func(s *corev1.Service) { s.Name = "third" }), nil, nil, defaultOpts)
	items := []Item{
		{Key: "ns1/new", Created: t0.Add(time.Minute), Result: newer},
		{Key: "ns1/third", Created: t0.Add(2 * time.Minute), Result: third},
		{Key: "ns1/old", Created: t0, Result: older},
	}
	taken := Taken{Frontends: map[Frontend]string{{VIP: netip.MustParseAddr("203.0.113.12"), Port: 80, Protocol: lbdv1.Protocol_PROTOCOL_TCP}: "operator-svc"}}
	got, problems := Merge(items, taken)
	names := []string{}
	for _, s := range got {
		names = append(names, s.Name)
	}
	if want := "ns1/new/http/tcp/203.0.113.11,ns1/old/http/tcp/203.0.113.10"; strings.Join(names, ",") != want {
		t.Errorf("merged = %v, want %s", names, want)
	}
	if p := problems["ns1/new"]; len(p) != 1 || p[0].Reason != "FrontendConflict" || !strings.Contains(p[0].Message, "ns1/old") {
		t.Errorf("problems of the newer Service = %v, want one conflict naming ns1/old", p)
	}
	if p := problems["ns1/third"]; len(p) != 1 || !strings.Contains(p[0].Message, "operator-svc") {
		t.Errorf("problems of the Service colliding with another owner = %v", p)
	}
	if p := problems["ns1/old"]; len(p) != 0 {
		t.Errorf("the oldest Service has problems %v", p)
	}
}

// TestProblemMessages checks that a left-out part is named by its field, so that the
// Event tells the operator what to fix.
func TestProblemMessages(t *testing.T) {
	svc := lbService([]string{"203.0.113.10"}, withExternalIPs("198.51.100.7"))
	s := slice("web-x", discoveryv1.AddressTypeIPv4, "http", corev1.ProtocolTCP, 8080,
		readyEP("198.18.10.1", "n1"), readyEP("239.1.2.3", "n1"), readyEP("169.254.0.7", "n1"))
	res := Service(svc, []*discoveryv1.EndpointSlice{s}, testNodes, defaultOpts)
	want := []Problem{
		{Reason: "ExternalIPNotAllowed", Message: "spec.externalIPs[0]: 198.51.100.7 not served: it is in no address pool of the adapter, and external IPs are served only inside one (CVE-2020-8554)"},
		{Reason: "InvalidEndpoint", Message: "EndpointSlice web-x: endpoints[1].addresses[0] 239.1.2.3 is a multicast address; endpoints[2].addresses[0] 169.254.0.7 is a link-local address: left out"},
	}
	if fmt.Sprint(res.Problems) != fmt.Sprint(want) {
		t.Errorf("problems:\n got  %v\n want %v", res.Problems, want)
	}
}

// TestMergeIngressBeforeExternal gives an older Service's external IP and a newer
// Service's ingress IP the same frontend: the ingress IP wins, so a user cannot take an
// allocated VIP away with spec.externalIPs.
func TestMergeIngressBeforeExternal(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	ext := Service(lbService(nil, withType(corev1.ServiceTypeClusterIP), withExternalIPs("203.0.113.10"), func(s *corev1.Service) { s.Name = "ext" }), nil, nil, defaultOpts)
	ing := Service(lbService([]string{"203.0.113.10"}, func(s *corev1.Service) { s.Name = "ing" }), nil, nil, defaultOpts)
	got, problems := Merge([]Item{{Key: "ns1/ext", Created: t0, Result: ext}, {Key: "ns1/ing", Created: t0.Add(time.Hour), Result: ing}}, Taken{})
	if names := renderAll(got); len(names) != 1 || !strings.HasPrefix(names[0], "ns1/ing/") {
		t.Errorf("merged = %v, want the ingress IP's service only", names)
	}
	if p := problems["ns1/ext"]; len(p) != 1 || !strings.Contains(p[0].Message, "ns1/ing") {
		t.Errorf("problems of the external IP's Service = %v, want a conflict naming ns1/ing", p)
	}
}

func TestServiceKeyVIP(t *testing.T) {
	name := ServiceName("ns1", "web", corev1.ServicePort{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP}, netip.MustParseAddr("2001:db8:ff::1"))
	key, vip, ok := ServiceKeyVIP(name)
	if !ok || key != "ns1/web" || vip != netip.MustParseAddr("2001:db8:ff::1") {
		t.Errorf("ServiceKeyVIP(%q) = %q, %v, %v", name, key, vip, ok)
	}
	if _, _, ok := ServiceKeyVIP("operator-web"); ok {
		t.Error("ServiceKeyVIP accepted a name the adapter does not make")
	}
}

func TestInputsDiffer(t *testing.T) {
	a := lbService([]string{"203.0.113.10"})
	for name, tc := range map[string]struct {
		edit func(*corev1.Service)
		want bool
	}{
		"conditions only": {func(s *corev1.Service) {
			s.Status.Conditions = []metav1.Condition{{Type: "x", Status: metav1.ConditionTrue}}
			s.ResourceVersion = "2"
		}, false},
		"ingress":    {func(s *corev1.Service) { s.Status.LoadBalancer.Ingress = nil }, true},
		"spec":       {func(s *corev1.Service) { s.Spec.Ports[0].Port = 81 }, true},
		"annotation": {func(s *corev1.Service) { s.Annotations = map[string]string{"a": "b"} }, true},
		"label":      {func(s *corev1.Service) { s.Labels = map[string]string{"a": "b"} }, true},
	} {
		b := a.DeepCopy()
		tc.edit(b)
		if got := InputsDiffer(a, b); got != tc.want {
			t.Errorf("%s: InputsDiffer = %v, want %v", name, got, tc.want)
		}
	}
}
