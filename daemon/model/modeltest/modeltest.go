// Package modeltest builds model services from messages written by tests, for the
// tests of packages below the store (datapath, reconciler, advertiser, health checks)
// that program services without a store. The daemon never imports it: there, only the
// store's validation parses a service's addresses.
package modeltest

import (
	"fmt"
	"net/netip"

	"github.com/lbd-dev/lbd/daemon/model"
	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
)

// Of returns svc with its addresses parsed, as it is (order, IDs and output-only fields
// kept): a backend without a node address is its own node, as the store makes it. It
// panics on an address that does not parse: a test's own mistake.
func Of(svc *lbdv1.Service) *model.Service {
	out := &model.Service{Spec: svc, VIP: must(netip.ParseAddr(svc.Vip))}
	for _, r := range svc.SourceRanges {
		out.SourceRanges = append(out.SourceRanges, must(netip.ParsePrefix(r)).Masked())
	}
	for _, b := range svc.Backends {
		addr := must(netip.ParseAddr(b.Address))
		node := addr
		if b.NodeAddress != "" {
			node = must(netip.ParseAddr(b.NodeAddress))
		}
		out.Backends = append(out.Backends, model.Backend{Addr: netip.AddrPortFrom(addr, uint16(b.Port)), Node: node})
	}
	return out
}

// All is Of for each service.
func All(svcs ...*lbdv1.Service) []*model.Service {
	out := make([]*model.Service, len(svcs))
	for i, s := range svcs {
		out[i] = Of(s)
	}
	return out
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(fmt.Sprintf("modeltest: %v", err))
	}
	return v
}
