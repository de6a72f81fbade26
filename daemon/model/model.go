// Package model is a service as the daemon works with it once the store accepted it:
// the API message (what the API serves, the state file and etcd keep) and the addresses
// in it, parsed once by the store's validation. Reconciler, datapath, advertiser and
// health checker read the typed addresses and never parse an address string again. BGP
// peers and traced flows carry their addresses typed the same way.
package model

import (
	"net/netip"

	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
)

// Service is a validated service. Nothing in it is modified once the store published
// it: copies with output-only status filled in (WithSpec) share its addresses.
type Service struct {
	// Spec is the normalized message: addresses in canonical form, backends sorted by
	// address and port, defaults explicit.
	Spec *lbdv1.Service
	// VIP is Spec.Vip.
	VIP netip.Addr
	// SourceRanges are Spec.SourceRanges, masked, in the same order.
	SourceRanges []netip.Prefix
	// Backends are the addresses of Spec.Backends, in the same order.
	Backends []Backend
}

// Backend is the addresses of one backend of a service.
type Backend struct {
	// Addr is the backend's address and port: its key within the service.
	Addr netip.AddrPort
	// Node is the address of the node its packets are sent to (node_address, or the
	// backend's own address when none is given).
	Node netip.Addr
}

// WithSpec returns the service with another message of it: a copy of Spec with its
// output-only fields filled (the backends in the same order). The addresses are shared.
func (s *Service) WithSpec(spec *lbdv1.Service) *Service {
	c := *s
	c.Spec = spec
	return &c
}

// Peer is a BGP peer the store accepted, with its address parsed.
type Peer struct {
	Spec *lbdv1.BgpPeer
	Addr netip.Addr
}

// Flow is one flow to run through the datapath (TraceFlow), as the API parsed it.
type Flow struct {
	Src, Dst netip.AddrPort
	Protocol lbdv1.Protocol
	// QUICDestinationConnectionID, when set, makes the traced packet a QUIC short-header
	// packet with this destination connection ID.
	QUICDestinationConnectionID []byte
}
