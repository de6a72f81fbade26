package translate

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
)

// endpoint is one usable endpoint of a Service: an address lbd accepts, the address of
// the node its Geneve packets go to, its conditions, and the slice it came from (whose
// ports apply to it).
type endpoint struct {
	addr, node                  netip.Addr
	ready, serving, terminating bool
	slice                       *discoveryv1.EndpointSlice
}

// maxDetails bounds how many endpoints one problem names; the rest are counted.
const maxDetails = 5

// endpoints returns the usable endpoints of the Service's EndpointSlices. An endpoint lbd
// would reject (or could not reach as asked) is left out, and each slice's left-out
// endpoints become one problem per reason that names their fields: one bad endpoint
// costs only itself, never the Service or the cluster's apply.
func endpoints(svc *corev1.Service, epSlices []*discoveryv1.EndpointSlice, nodes NodeAddresses, problem func(string, string, ...any)) []endpoint {
	local := svc.Spec.ExternalTrafficPolicy == corev1.ServiceExternalTrafficPolicyLocal
	var mine []*discoveryv1.EndpointSlice
	for _, s := range epSlices {
		if s.Namespace == svc.Namespace && s.Labels[discoveryv1.LabelServiceName] == svc.Name &&
			(s.AddressType == discoveryv1.AddressTypeIPv4 || s.AddressType == discoveryv1.AddressTypeIPv6) {
			mine = append(mine, s)
		}
	}
	// Problems in a stable order, so that an unchanged problem is not reported again.
	slices.SortFunc(mine, func(a, b *discoveryv1.EndpointSlice) int { return strings.Compare(a.Name, b.Name) })
	var out []endpoint
	for _, s := range mine {
		skipped := map[string][]string{}
		var reasons []string
		skip := func(reason, format string, args ...any) {
			if _, seen := skipped[reason]; !seen {
				reasons = append(reasons, reason)
			}
			skipped[reason] = append(skipped[reason], fmt.Sprintf(format, args...))
		}
		for i, ep := range s.Endpoints {
			if len(ep.Addresses) == 0 {
				continue
			}
			// Only the first address of an endpoint is significant (EndpointSlice API).
			field := fmt.Sprintf("endpoints[%d].addresses[0]", i)
			a, err := netip.ParseAddr(ep.Addresses[0])
			if err != nil {
				skip("InvalidEndpoint", "%s %q is not an IP address", field, ep.Addresses[0])
				continue
			}
			if why := unusable(a); why != "" {
				skip("InvalidEndpoint", "%s %s %s", field, a, why)
				continue
			}
			a = a.Unmap()
			if a.Is4() != (s.AddressType == discoveryv1.AddressTypeIPv4) {
				skip("InvalidEndpoint", "%s %s is not of the slice's addressType %s", field, a, s.AddressType)
				continue
			}
			e := endpoint{addr: a, slice: s}
			nodeName := ""
			if ep.NodeName != nil {
				nodeName = *ep.NodeName
			}
			node, ok := nodeAddress(nodes[nodeName], a.Is4())
			switch {
			case ok:
				if why := unusable(node); why != "" {
					skip("InvalidNodeAddress", "endpoints[%d] (%s): node %q has InternalIP %s, which %s", i, a, nodeName, node, why)
					continue
				}
				e.node = node
			case local:
				// Local: the packet must reach the endpoint's own node, never a relay.
				skip("EndpointNodeUnknown", "endpoints[%d] (%s): %s", i, a, unknownNode(nodeName, a))
				continue
			default:
				e.node = a
			}
			e.terminating = ep.Conditions.Terminating != nil && *ep.Conditions.Terminating
			e.ready = (ep.Conditions.Ready == nil || *ep.Conditions.Ready) && !e.terminating
			e.serving = e.ready
			if ep.Conditions.Serving != nil {
				e.serving = *ep.Conditions.Serving
			}
			out = append(out, e)
		}
		for _, reason := range reasons {
			details := skipped[reason]
			more := ""
			if len(details) > maxDetails {
				more = fmt.Sprintf(" (and %d more)", len(details)-maxDetails)
				details = details[:maxDetails]
			}
			problem(reason, "EndpointSlice %s: %s%s: left out", s.Name, strings.Join(details, "; "), more)
		}
	}
	return out
}

// unusable says why lbd cannot use a as a backend or node address ("" if it can): the
// addresses lbd's validation rejects, and link-local and broadcast addresses, which no
// Geneve packet can be routed to.
func unusable(a netip.Addr) string {
	switch {
	case a.Zone() != "":
		return "has a zone"
	case a.IsUnspecified():
		return "is the unspecified address"
	case a.IsMulticast():
		return "is a multicast address"
	case a.IsLoopback():
		return "is a loopback address"
	case a.IsLinkLocalUnicast():
		return "is a link-local address"
	case a.Unmap() == netip.AddrFrom4([4]byte{255, 255, 255, 255}):
		return "is the broadcast address"
	}
	return ""
}

func unknownNode(name string, a netip.Addr) string {
	if name == "" {
		return "no nodeName, and externalTrafficPolicy Local sends only to an endpoint's own node"
	}
	return fmt.Sprintf("node %q has no %s InternalIP, and externalTrafficPolicy Local sends only to an endpoint's own node", name, familyName(a))
}

// nodeAddress is a node's first InternalIP of a family.
func nodeAddress(addrs []netip.Addr, ipv4 bool) (netip.Addr, bool) {
	for _, a := range addrs {
		if a.Is4() == ipv4 {
			return a, true
		}
	}
	return netip.Addr{}, false
}

// candidate is one endpoint of a Service port.
type candidate struct {
	endpoint
	port uint32
}

// backendsFor selects the backends of one Service port for one VIP family: ready
// endpoints take new flows; if none is ready, serving terminating ones do (kube-proxy's
// fallback, so a rolling update of every pod does not black-hole the VIP). Every other
// endpoint drains: it takes no new flow, and its established flows go on until it leaves
// the slice. That is what kube-proxy does to a pod that turns not-ready (its conntrack
// entries stay) or terminates; removing the backend would cut those flows.
func backendsFor(sp corev1.ServicePort, family netip.Addr, eps []endpoint) []*lbdv1.Backend {
	cands := map[netip.AddrPort]candidate{}
	for _, e := range eps {
		if e.addr.Is4() != family.Is4() {
			continue
		}
		port, ok := slicePort(e.slice, sp)
		if !ok {
			continue
		}
		c := candidate{endpoint: e, port: port}
		key := netip.AddrPortFrom(e.addr, uint16(port))
		// The same endpoint may briefly appear in two slices; the more usable copy wins.
		if old, dup := cands[key]; dup && rank(old) >= rank(c) {
			continue
		}
		cands[key] = c
	}
	haveReady := false
	for _, c := range cands {
		haveReady = haveReady || c.ready
	}
	out := make([]*lbdv1.Backend, 0, len(cands))
	for _, c := range cands {
		state := lbdv1.BackendState_BACKEND_STATE_DRAINING
		if c.ready || (c.terminating && c.serving && !haveReady) {
			state = lbdv1.BackendState_BACKEND_STATE_ACTIVE
		}
		out = append(out, &lbdv1.Backend{
			Address:     c.addr.String(),
			Port:        c.port,
			NodeAddress: c.node.String(),
			State:       state,
		})
	}
	slices.SortFunc(out, func(a, b *lbdv1.Backend) int {
		return cmp.Or(
			netip.MustParseAddr(a.Address).Compare(netip.MustParseAddr(b.Address)),
			cmp.Compare(a.Port, b.Port))
	})
	return out
}

func rank(c candidate) int {
	switch {
	case c.ready:
		return 3
	case c.serving:
		return 2
	case c.terminating:
		return 1
	}
	return 0
}

// slicePort finds the target port of a Service port in a slice: same name and protocol.
func slicePort(s *discoveryv1.EndpointSlice, sp corev1.ServicePort) (uint32, bool) {
	for _, p := range s.Ports {
		name, proto := "", corev1.ProtocolTCP
		if p.Name != nil {
			name = *p.Name
		}
		if p.Protocol != nil {
			proto = *p.Protocol
		}
		spProto := sp.Protocol
		if spProto == "" {
			spProto = corev1.ProtocolTCP
		}
		if name == sp.Name && proto == spProto && p.Port != nil && *p.Port > 0 && *p.Port <= 65535 {
			return uint32(*p.Port), true
		}
	}
	return 0, false
}
