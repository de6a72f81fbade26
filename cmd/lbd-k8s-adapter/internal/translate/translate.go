// Package translate turns Kubernetes Services, EndpointSlices and Nodes into lbd services,
// following the service-proxy rules that apply to an external load balancer. It is pure:
// plain objects in, lbd services and problems out, no cluster and no lbd needed.
package translate

import (
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
	"google.golang.org/protobuf/types/known/durationpb"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/equality"
)

// LabelServiceProxyName is the label by which a Service asks for a specific service proxy;
// Services labelled with another proxy's name are left alone.
const LabelServiceProxyName = "service.kubernetes.io/service-proxy-name"

// maxAffinitySeconds is both Kubernetes' and lbd's upper bound for ClientIP affinity.
const maxAffinitySeconds = 86400

// Options are the cluster-wide translation settings (from the adapter's config file).
type Options struct {
	// LoadBalancerClass is the spec.loadBalancerClass of the LoadBalancer Services that are ours.
	LoadBalancerClass string
	// ClaimClassless makes LoadBalancer Services without a class ours too.
	ClaimClassless bool
	// ServiceProxyName is our value of the service-proxy-name label: Services labelled with it
	// are ours, Services labelled with any other value are ignored.
	ServiceProxyName string
	// ExternalIPs serves spec.externalIPs (of ClusterIP and NodePort Services, and of
	// LoadBalancer Services that are ours), but only addresses for which ExternalIPPool
	// names a pool: anyone who may create a Service could otherwise capture any address's
	// traffic (CVE-2020-8554).
	ExternalIPs bool
	// ExternalIPPool returns the name of the configured pool that holds a, or "".
	ExternalIPPool func(a netip.Addr) string
	// MaxBackendsPerService caps the backends of one lbd service (lbd's own limit); 0 means
	// no cap.
	MaxBackendsPerService int
}

// Problem says why (part of) a Service was not translated. Reason is a CamelCase word fit
// for a Kubernetes Event's reason.
type Problem struct {
	Reason  string
	Message string
}

// Result is the translation of one Kubernetes Service.
type Result struct {
	// Services are the lbd services, one per VIP × port × protocol, sorted by name.
	Services []*lbdv1.Service
	// ExternalVIPs are the VIPs that come from spec.externalIPs only: an ingress IP is
	// preferred over them when two Services claim one frontend.
	ExternalVIPs []netip.Addr
	Problems     []Problem
}

// NodeAddresses maps a node name to its InternalIP addresses.
type NodeAddresses map[string][]netip.Addr

// NodeInternalIPs extracts the InternalIP addresses of a Node.
func NodeInternalIPs(n *corev1.Node) []netip.Addr {
	var out []netip.Addr
	for _, a := range n.Status.Addresses {
		if a.Type != corev1.NodeInternalIP {
			continue
		}
		if ip, err := netip.ParseAddr(a.Address); err == nil {
			out = append(out, ip.Unmap())
		}
	}
	return out
}

// Managed reports whether the Service is one a service proxy handles at all: not
// ExternalName, not headless, and not asking for another service proxy.
func Managed(svc *corev1.Service, opt Options) bool {
	if svc.Spec.Type == corev1.ServiceTypeExternalName || svc.Spec.ClusterIP == corev1.ClusterIPNone {
		return false
	}
	if name, ok := svc.Labels[LabelServiceProxyName]; ok && name != opt.ServiceProxyName {
		return false
	}
	return true
}

// OwnsLoadBalancer reports whether the Service is a LoadBalancer Service of our class: one
// whose ingress IPs we serve and, when it has none, allocate.
func OwnsLoadBalancer(svc *corev1.Service, opt Options) bool {
	if svc.Spec.Type != corev1.ServiceTypeLoadBalancer || !Managed(svc, opt) {
		return false
	}
	if svc.Spec.LoadBalancerClass == nil {
		return opt.ClaimClassless
	}
	return *svc.Spec.LoadBalancerClass == opt.LoadBalancerClass
}

// vip is one frontend address of a Service and whether it is a load-balancer ingress IP
// (source ranges apply only to those, as in kube-proxy).
type vip struct {
	addr netip.Addr
	lb   bool
}

// Service translates one Service with its EndpointSlices. Slices of other Services, and of
// other address types, are ignored, so callers may pass a superset.
func Service(svc *corev1.Service, epSlices []*discoveryv1.EndpointSlice, nodes NodeAddresses, opt Options) Result {
	var res Result
	if !Managed(svc, opt) {
		return res
	}
	problem := func(reason, format string, args ...any) {
		res.Problems = append(res.Problems, Problem{Reason: reason, Message: fmt.Sprintf(format, args...)})
	}
	vips := serviceVIPs(svc, opt, problem)
	if len(vips) == 0 {
		return res
	}
	for _, v := range vips {
		if !v.lb {
			res.ExternalVIPs = append(res.ExternalVIPs, v.addr)
		}
	}
	ranges := sourceRanges(svc, problem)
	affinity := sessionAffinity(svc)
	eps := endpoints(svc, epSlices, nodes, problem)
	for _, sp := range svc.Spec.Ports {
		proto, ok := protocolOf(sp.Protocol)
		if !ok {
			problem("UnsupportedProtocol", "port %s: protocol %s is not supported by lbd (TCP, UDP and SCTP only)", portID(sp), sp.Protocol)
			continue
		}
		for _, v := range vips {
			var svcRanges []string
			if v.lb && len(ranges) > 0 {
				svcRanges = rangesOfFamily(ranges, v.addr)
				if len(svcRanges) == 0 {
					// lbd reads an empty list as "allow all": fail closed instead.
					problem("SourceRangesFamily", "VIP %s not served: loadBalancerSourceRanges has no %s range", v.addr, familyName(v.addr))
					continue
				}
			}
			backends := backendsFor(sp, v.addr, eps)
			if opt.MaxBackendsPerService > 0 && len(backends) > opt.MaxBackendsPerService {
				problem("TooManyBackends", "port %s VIP %s: %d endpoints, only the first %d are used", portID(sp), v.addr, len(backends), opt.MaxBackendsPerService)
				backends = backends[:opt.MaxBackendsPerService]
			}
			if bad := sctpPortTranslated(proto, sp, backends); bad != nil {
				problem("SCTPTargetPort", "port %s VIP %s not served: endpoint %s:%d is not on the Service's port; lbd does not "+
					"translate SCTP ports (targetPort must equal port)", portID(sp), v.addr, bad.Address, bad.Port)
				continue
			}
			res.Services = append(res.Services, &lbdv1.Service{
				Name:            ServiceName(svc.Namespace, svc.Name, sp, v.addr),
				Vip:             v.addr.String(),
				Port:            uint32(sp.Port),
				Protocol:        proto,
				SessionAffinity: affinity,
				SourceRanges:    svcRanges,
				Backends:        backends,
			})
		}
	}
	slices.SortFunc(res.Services, func(a, b *lbdv1.Service) int { return strings.Compare(a.Name, b.Name) })
	return res
}

// InputsDiffer reports whether two versions of a Service may translate differently: they
// differ in what Service reads (spec, labels, annotations, status ingress), not only in
// the rest of the status, such as conditions.
func InputsDiffer(a, b *corev1.Service) bool {
	return !equality.Semantic.DeepEqual(a.Spec, b.Spec) ||
		!maps.Equal(a.Labels, b.Labels) || !maps.Equal(a.Annotations, b.Annotations) ||
		!equality.Semantic.DeepEqual(a.Status.LoadBalancer, b.Status.LoadBalancer)
}

// ServiceName is the lbd service name of one port and VIP of a Service:
// "<namespace>/<name>/<port name or number>/<tcp|udp>/<vip>", within lbd's name charset
// (Kubernetes names and port names use only [a-z0-9-]).
func ServiceName(namespace, name string, sp corev1.ServicePort, addr netip.Addr) string {
	return fmt.Sprintf("%s/%s/%s/%s/%s", namespace, name, portID(sp), strings.ToLower(string(sp.Protocol)), addr)
}

// ServiceKeyVIP splits an lbd service name made by ServiceName into the Service's key
// ("<namespace>/<name>") and the VIP; ok is false for any other name.
func ServiceKeyVIP(lbdName string) (key string, addr netip.Addr, ok bool) {
	parts := strings.Split(lbdName, "/")
	if len(parts) != 5 {
		return "", netip.Addr{}, false
	}
	a, err := netip.ParseAddr(parts[4])
	if err != nil {
		return "", netip.Addr{}, false
	}
	return parts[0] + "/" + parts[1], a, true
}

func portID(sp corev1.ServicePort) string {
	if sp.Name != "" {
		return sp.Name
	}
	return strconv.Itoa(int(sp.Port))
}

func protocolOf(p corev1.Protocol) (lbdv1.Protocol, bool) {
	switch p {
	case corev1.ProtocolTCP, "":
		return lbdv1.Protocol_PROTOCOL_TCP, true
	case corev1.ProtocolUDP:
		return lbdv1.Protocol_PROTOCOL_UDP, true
	case corev1.ProtocolSCTP:
		return lbdv1.Protocol_PROTOCOL_SCTP, true
	}
	return lbdv1.Protocol_PROTOCOL_UNSPECIFIED, false
}

// sctpPortTranslated returns a backend of an SCTP port that listens on another port
// than the Service's, which lbd refuses (its CRC32c covers the ports), or nil.
func sctpPortTranslated(proto lbdv1.Protocol, sp corev1.ServicePort, backends []*lbdv1.Backend) *lbdv1.Backend {
	if proto != lbdv1.Protocol_PROTOCOL_SCTP {
		return nil
	}
	for _, b := range backends {
		if b.Port != uint32(sp.Port) {
			return b
		}
	}
	return nil
}

// serviceVIPs collects the Service's frontend addresses, deduplicated, in a stable order.
func serviceVIPs(svc *corev1.Service, opt Options, problem func(string, string, ...any)) []vip {
	var out []vip
	seen := map[netip.Addr]int{}
	add := func(field, s string, lb bool) {
		a, err := netip.ParseAddr(s)
		if err != nil {
			problem("InvalidVIP", "%s: %q is not an IP address", field, s)
			return
		}
		if why := unusable(a); why != "" {
			problem("InvalidVIP", "%s: %s %s", field, a, why)
			return
		}
		a = a.Unmap()
		if i, dup := seen[a]; dup {
			// An address that is both an ingress IP and an external IP keeps the stricter
			// ingress semantics (source ranges apply).
			out[i].lb = out[i].lb || lb
			return
		}
		seen[a] = len(out)
		out = append(out, vip{addr: a, lb: lb})
	}
	lbOurs := OwnsLoadBalancer(svc, opt)
	if lbOurs {
		for i, ing := range svc.Status.LoadBalancer.Ingress {
			if ing.IP != "" {
				add(fmt.Sprintf("status.loadBalancer.ingress[%d].ip", i), ing.IP, true)
			}
		}
	}
	if !lbOurs && svc.Spec.Type == corev1.ServiceTypeLoadBalancer {
		return out // another implementation's Service: its external IPs are not ours either
	}
	for i, ip := range svc.Spec.ExternalIPs {
		field := fmt.Sprintf("spec.externalIPs[%d]", i)
		switch a, err := netip.ParseAddr(ip); {
		case !opt.ExternalIPs:
			if lbOurs {
				problem("ExternalIPsDisabled", "%s: %s not served: the adapter serves external IPs only with externalIPs: true in its configuration", field, ip)
			}
		case err == nil && (opt.ExternalIPPool == nil || opt.ExternalIPPool(a.Unmap()) == ""):
			problem("ExternalIPNotAllowed", "%s: %s not served: it is in no address pool of the adapter, and external IPs are served only inside one (CVE-2020-8554)", field, a)
		default:
			add(field, ip, false)
		}
	}
	return out
}

// sourceRanges returns the Service's allowed client prefixes: the field, or the legacy
// annotation when the field is empty (the precedence kube-proxy uses).
func sourceRanges(svc *corev1.Service, problem func(string, string, ...any)) []netip.Prefix {
	raw := svc.Spec.LoadBalancerSourceRanges
	if len(raw) == 0 {
		if ann := strings.TrimSpace(svc.Annotations[corev1.AnnotationLoadBalancerSourceRangesKey]); ann != "" {
			raw = strings.Split(ann, ",")
		}
	}
	var out []netip.Prefix
	for _, r := range raw {
		p, err := netip.ParsePrefix(strings.TrimSpace(r))
		if err != nil {
			problem("InvalidSourceRange", "source range %q ignored: not a CIDR prefix", r)
			continue
		}
		out = append(out, netip.PrefixFrom(p.Addr().Unmap(), p.Bits()).Masked())
	}
	return out
}

func rangesOfFamily(ranges []netip.Prefix, addr netip.Addr) []string {
	var out []string
	for _, p := range ranges {
		if p.Addr().Is4() == addr.Is4() && !slices.Contains(out, p.String()) {
			out = append(out, p.String())
		}
	}
	slices.Sort(out)
	return out
}

func familyName(a netip.Addr) string {
	if a.Is4() {
		return "IPv4"
	}
	return "IPv6"
}

func sessionAffinity(svc *corev1.Service) *lbdv1.SessionAffinity {
	if svc.Spec.SessionAffinity != corev1.ServiceAffinityClientIP {
		return nil
	}
	secs := corev1.DefaultClientIPServiceAffinitySeconds
	if c := svc.Spec.SessionAffinityConfig; c != nil && c.ClientIP != nil && c.ClientIP.TimeoutSeconds != nil {
		secs = min(max(*c.ClientIP.TimeoutSeconds, 1), maxAffinitySeconds)
	}
	return &lbdv1.SessionAffinity{Timeout: durationpb.New(time.Duration(secs) * time.Second)}
}
