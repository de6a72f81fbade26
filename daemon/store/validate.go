package store

import (
	"fmt"
	"net/netip"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/lbd-dev/lbd/daemon/maglev"
	"github.com/lbd-dev/lbd/daemon/model"
	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
)

// Limits bound what the store accepts, so one bad client cannot exhaust the datapath maps.
type Limits struct {
	// MaxServices bounds the number of services (service IDs index datapath maps).
	MaxServices int `json:"max_services"`
	// MaxBackendsPerService bounds the backends of one service.
	MaxBackendsPerService int `json:"max_backends_per_service"`
	// MaxBackends bounds the backends of all services together (backend IDs index a
	// datapath map of this size).
	MaxBackends     int `json:"max_backends"`
	MaxSourceRanges int `json:"max_source_ranges"`
	MaxBgpPeers     int `json:"max_bgp_peers"`
	// DefaultTableSize is the Maglev table size of services that do not set one. It is
	// stored in each service, so changing it later does not reshuffle existing tables.
	// 0 (the default) stores none: each table's size then follows its service's number
	// of backends, at least 200 slots per backend (see docs/operations.md).
	DefaultTableSize uint32 `json:"default_maglev_table_size"`
}

// DefaultLimits are lbd's defaults; the datapath's ID-indexed maps are sized from the
// limits, one entry more than each (daemon/lbd/datapathcfg.go).
func DefaultLimits() Limits {
	return Limits{
		MaxServices:           16384,
		MaxBackendsPerService: 1024,
		MaxBackends:           262143,
		MaxSourceRanges:       256,
		MaxBgpPeers:           64,
	}
}

// Validate checks the limits themselves.
func (l Limits) Validate() error {
	switch {
	case l.MaxServices < 1:
		return fmt.Errorf("max_services must be at least 1, got %d", l.MaxServices)
	case l.MaxBackendsPerService < 1:
		return fmt.Errorf("max_backends_per_service must be at least 1, got %d", l.MaxBackendsPerService)
	case l.MaxBackends < l.MaxBackendsPerService:
		return fmt.Errorf("max_backends (%d) must be at least max_backends_per_service (%d)", l.MaxBackends, l.MaxBackendsPerService)
	case l.MaxSourceRanges < 0:
		return fmt.Errorf("max_source_ranges must not be negative, got %d", l.MaxSourceRanges)
	case l.MaxBgpPeers < 0:
		return fmt.Errorf("max_bgp_peers must not be negative, got %d", l.MaxBgpPeers)
	}
	if l.DefaultTableSize == 0 {
		return nil
	}
	if err := maglev.ValidateTableSize(l.DefaultTableSize); err != nil {
		return fmt.Errorf("default_maglev_table_size: %w", err)
	}
	return nil
}

// tableSizes remembers the table sizes found valid: a primality test per service would
// be most of the cost of validating thousands of them, and few sizes are in use.
var tableSizes sync.Map

func validTableSize(m uint32) error {
	if _, ok := tableSizes.Load(m); ok {
		return nil
	}
	if err := maglev.ValidateTableSize(m); err != nil {
		return err
	}
	tableSizes.Store(m, true)
	return nil
}

// nameRE is the shape of service and owner names: printable, no spaces, fit for a CLI
// argument and a Kubernetes-derived name like "default/web:http/203.0.113.10".
var nameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._:/-]{0,252}$`)

const (
	maxAffinityTimeout = 24 * time.Hour
	minHCInterval      = 100 * time.Millisecond
	maxHCInterval      = time.Hour
	maxRiseFall        = 100
)

// Health check defaults (documented in the proto).
const (
	defaultHCInterval = 5 * time.Second
	defaultHCTimeout  = 2 * time.Second
	defaultHCRise     = 2
	defaultHCFall     = 3
	defaultStatusMin  = 200
	defaultStatusMax  = 399
)

func validateName(field, name string) *Error {
	if name == "" {
		return invalid(field, "must not be empty")
	}
	if !nameRE.MatchString(name) {
		return invalid(field, "%q must be 1-253 characters of [A-Za-z0-9._:/-] starting with a letter or digit", name)
	}
	return nil
}

// parseAddr parses a unicast address in canonical form.
func parseAddr(field, s string) (netip.Addr, *Error) {
	if s == "" {
		return netip.Addr{}, invalid(field, "must not be empty")
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Addr{}, invalid(field, "%q is not an IP address", s)
	}
	switch {
	case a.Zone() != "":
		return a, invalid(field, "%q: zones are not allowed", s)
	case a.Is4In6():
		return a, invalid(field, "%q: write IPv4-mapped addresses in IPv4 form", s)
	case a.IsUnspecified():
		return a, invalid(field, "%q is the unspecified address", s)
	case a.IsMulticast():
		return a, invalid(field, "%q is a multicast address", s)
	case a.IsLoopback():
		return a, invalid(field, "%q is a loopback address", s)
	}
	return a, nil
}

// parseBackendRef parses the address and port that name a backend in a request.
func parseBackendRef(address string, port uint32) (netip.AddrPort, error) {
	a, err := netip.ParseAddr(address)
	if err != nil {
		return netip.AddrPort{}, invalid("address", "%q is not an IP address", address)
	}
	if port > 65535 {
		return netip.AddrPort{}, invalid("port", "%d is not a port (0-65535)", port)
	}
	return netip.AddrPortFrom(a.WithZone(""), uint16(port)), nil
}

func family(a netip.Addr) string {
	if a.Is4() {
		return "IPv4"
	}
	return "IPv6"
}

func validPort(field string, p uint32) *Error {
	if p > 65535 {
		return invalid(field, "%d is not a port (0-65535)", p)
	}
	return nil
}

// normalizeService validates svc and returns a normalized copy: defaults made explicit,
// addresses in canonical form, backends sorted. Output-only fields are cleared. svc is not
// modified. It is where every service that enters the store (API calls, the state file,
// the fleet's etcd) has its addresses parsed, once: the result carries them typed.
func normalizeService(svc *lbdv1.Service, lim Limits) (*model.Service, *Error) {
	return normalize(svc, lim, false)
}

// normalizeStored is normalizeService for a service that the store itself wrote (the
// state file, the fleet's etcd): its ID, revision and backend IDs are kept.
func normalizeStored(svc *lbdv1.Service, lim Limits) (*model.Service, *Error) {
	return normalize(svc, lim, true)
}

func normalize(svc *lbdv1.Service, lim Limits, keepIDs bool) (*model.Service, *Error) {
	if svc == nil {
		return nil, invalid("service", "is required")
	}
	s := proto.Clone(svc).(*lbdv1.Service)
	s.Status = nil
	if !keepIDs {
		s.Id, s.Revision = 0, 0
		for _, b := range s.Backends {
			if b != nil {
				b.Id = 0
			}
		}
	}
	if err := validateName("service.name", s.Name); err != nil {
		return nil, err
	}
	if s.Owner != "" {
		if err := validateName("service.owner", s.Owner); err != nil {
			return nil, err
		}
	}
	vip, err := parseAddr("service.vip", s.Vip)
	if err != nil {
		return nil, err
	}
	s.Vip = vip.String()
	if err := validPort("service.port", s.Port); err != nil {
		return nil, err
	}
	switch s.Protocol {
	case lbdv1.Protocol_PROTOCOL_TCP, lbdv1.Protocol_PROTOCOL_UDP, lbdv1.Protocol_PROTOCOL_SCTP:
	case lbdv1.Protocol_PROTOCOL_UNSPECIFIED:
		return nil, invalid("service.protocol", "is required (TCP, UDP or SCTP)")
	default:
		return nil, invalid("service.protocol", "unknown protocol %d", s.Protocol)
	}
	if err := validateQUIC(s); err != nil {
		return nil, err
	}
	if s.MaglevTableSize == 0 {
		s.MaglevTableSize = lim.DefaultTableSize
	}
	if s.MaglevTableSize != 0 {
		if err := validTableSize(s.MaglevTableSize); err != nil {
			return nil, invalid("service.maglev_table_size", "%v", err)
		}
	}
	switch s.HashMode {
	case lbdv1.HashMode_HASH_MODE_UNSPECIFIED:
		s.HashMode = lbdv1.HashMode_HASH_MODE_FIVE_TUPLE
	case lbdv1.HashMode_HASH_MODE_FIVE_TUPLE, lbdv1.HashMode_HASH_MODE_SOURCE_ADDRESS:
	default:
		return nil, invalid("service.hash_mode", "unknown hash mode %d", s.HashMode)
	}
	switch s.NoBackendAction {
	case lbdv1.NoBackendAction_NO_BACKEND_ACTION_UNSPECIFIED:
		s.NoBackendAction = lbdv1.NoBackendAction_NO_BACKEND_ACTION_REJECT
	case lbdv1.NoBackendAction_NO_BACKEND_ACTION_REJECT, lbdv1.NoBackendAction_NO_BACKEND_ACTION_DROP:
	default:
		return nil, invalid("service.no_backend_action", "unknown action %d", s.NoBackendAction)
	}
	switch s.AdvertisePolicy {
	case lbdv1.AdvertisePolicy_ADVERTISE_POLICY_UNSPECIFIED:
		s.AdvertisePolicy = lbdv1.AdvertisePolicy_ADVERTISE_POLICY_IF_HEALTHY
	case lbdv1.AdvertisePolicy_ADVERTISE_POLICY_IF_HEALTHY, lbdv1.AdvertisePolicy_ADVERTISE_POLICY_ALWAYS:
	default:
		return nil, invalid("service.advertise_policy", "unknown policy %d", s.AdvertisePolicy)
	}
	if a := s.SessionAffinity; a != nil {
		if a.Timeout == nil {
			return nil, invalid("service.session_affinity.timeout", "is required when session affinity is set")
		}
		if err := a.Timeout.CheckValid(); err != nil {
			return nil, invalid("service.session_affinity.timeout", "%v", err)
		}
		d := a.Timeout.AsDuration()
		if d < time.Second || d > maxAffinityTimeout || d%time.Second != 0 {
			return nil, invalid("service.session_affinity.timeout", "%v must be whole seconds from 1s to %v", d, maxAffinityTimeout)
		}
	}
	ranges, err := normalizeSourceRanges(s, vip, lim)
	if err != nil {
		return nil, err
	}
	if err := normalizeHealthCheck(s); err != nil {
		return nil, err
	}
	if len(s.Backends) > lim.MaxBackendsPerService {
		return nil, invalid("service.backends", "%d backends exceed the limit of %d per service", len(s.Backends), lim.MaxBackendsPerService)
	}
	seen := make(map[netip.AddrPort]int, len(s.Backends))
	out := &model.Service{Spec: s, VIP: vip, SourceRanges: ranges, Backends: make([]model.Backend, len(s.Backends))}
	var weights uint32
	for i, b := range s.Backends {
		field := fmt.Sprintf("service.backends[%d]", i)
		if b == nil {
			return nil, invalid(field, "is empty")
		}
		nb, addrs, err := fixBackend(field, b, vip, s) // b is part of the clone s
		if err != nil {
			return nil, err
		}
		if j, dup := seen[addrs.Addr]; dup {
			return nil, invalid(field, "duplicate backend %s (also backends[%d])", addrs.Addr, j)
		}
		seen[addrs.Addr] = i
		weights += nb.Weight
		s.Backends[i], out.Backends[i] = nb, addrs
	}
	if m := maglev.TableSize(s.MaglevTableSize, len(s.Backends), uint64(weights)); weights > m {
		return nil, invalid("service.backends", "weights add up to %d, more than the Maglev table size %d", weights, m)
	}
	if i, j, dup := duplicateQUICServerID(s.Backends); dup {
		return nil, invalid(fmt.Sprintf("service.backends[%d].quic_server_id", j), "%x is also the server ID of backends[%d]", s.Backends[j].QuicServerId, i)
	}
	sortBackends(out)
	return out, nil
}

// QUIC-LB's bounds: config rotation codepoints 0-6 (0b111 marks unroutable connection
// IDs), server IDs of 1-15 bytes.
const (
	maxQUICConfigID    = 6
	maxQUICServerIDLen = 15
)

func validateQUIC(s *lbdv1.Service) *Error {
	q := s.Quic
	if q == nil {
		return nil
	}
	if s.Protocol != lbdv1.Protocol_PROTOCOL_UDP {
		return invalid("service.quic", "QUIC routing is for UDP services only")
	}
	if q.ConfigId > maxQUICConfigID {
		return invalid("service.quic.config_id", "%d must be 0-%d (7 marks unroutable connection IDs)", q.ConfigId, maxQUICConfigID)
	}
	if q.ServerIdLength < 1 || q.ServerIdLength > maxQUICServerIDLen {
		return invalid("service.quic.server_id_length", "%d must be 1-%d bytes", q.ServerIdLength, maxQUICServerIDLen)
	}
	return nil
}

// duplicateQUICServerID finds two backends with one QUIC server ID: a connection ID
// must name one backend.
func duplicateQUICServerID(bs []*lbdv1.Backend) (first, second int, dup bool) {
	seen := map[string]int{}
	for i, b := range bs {
		if len(b.QuicServerId) == 0 {
			continue
		}
		if j, ok := seen[string(b.QuicServerId)]; ok {
			return j, i, true
		}
		seen[string(b.QuicServerId)] = i
	}
	return 0, 0, false
}

// normalizeSourceRanges checks and masks the service's source ranges, sorts them as
// strings (the order the API shows) and returns them parsed, in that order.
func normalizeSourceRanges(s *lbdv1.Service, vip netip.Addr, lim Limits) ([]netip.Prefix, *Error) {
	if len(s.SourceRanges) > lim.MaxSourceRanges {
		return nil, invalid("service.source_ranges", "%d ranges exceed the limit of %d", len(s.SourceRanges), lim.MaxSourceRanges)
	}
	if len(s.SourceRanges) == 0 {
		return nil, nil
	}
	out := make([]netip.Prefix, 0, len(s.SourceRanges))
	seen := make(map[netip.Prefix]bool, len(s.SourceRanges))
	for i, r := range s.SourceRanges {
		field := fmt.Sprintf("service.source_ranges[%d]", i)
		p, err := netip.ParsePrefix(r)
		if err != nil {
			return nil, invalid(field, "%q is not a CIDR prefix", r)
		}
		if p.Addr().Is4In6() || p.Addr().Zone() != "" {
			return nil, invalid(field, "%q: use plain IPv4 or IPv6 prefixes", r)
		}
		if p.Addr().Is4() != vip.Is4() {
			return nil, invalid(field, "%q is not of the VIP's family (%s)", r, family(vip))
		}
		p = p.Masked()
		if seen[p] {
			return nil, invalid(field, "duplicate range %s", p)
		}
		seen[p] = true
		out = append(out, p)
	}
	slices.SortFunc(out, func(a, b netip.Prefix) int { return strings.Compare(a.String(), b.String()) })
	for i, p := range out {
		s.SourceRanges[i] = p.String()
	}
	return out, nil
}

// normalizeBackend validates one backend of svc, whose VIP is vip.
func normalizeBackend(field string, b *lbdv1.Backend, vip netip.Addr, svc *lbdv1.Service) (*lbdv1.Backend, model.Backend, *Error) {
	if b == nil {
		return nil, model.Backend{}, invalid(field, "is empty")
	}
	nb := proto.Clone(b).(*lbdv1.Backend)
	nb.Id = 0
	return fixBackend(field, nb, vip, svc)
}

// fixBackend is normalizeBackend on a backend of the caller's own, changed in place.
// Its ID is kept: normalizeService clears it for API input.
func fixBackend(field string, nb *lbdv1.Backend, vip netip.Addr, svc *lbdv1.Service) (*lbdv1.Backend, model.Backend, *Error) {
	nb.Health, nb.TableSlots = nil, 0
	addr, err := parseAddr(field+".address", nb.Address)
	if err != nil {
		return nil, model.Backend{}, err
	}
	if addr.Is4() != vip.Is4() {
		return nil, model.Backend{}, invalid(field+".address", "%s is %s but the VIP %s is %s", addr, family(addr), vip, family(vip))
	}
	nb.Address = addr.String()
	if err := validPort(field+".port", nb.Port); err != nil {
		return nil, model.Backend{}, err
	}
	switch {
	case svc.Port == 0 && nb.Port != 0:
		return nil, model.Backend{}, invalid(field+".port", "must be 0 for a service on all ports (the client's port is kept)")
	case svc.Port != 0 && nb.Port == 0:
		return nil, model.Backend{}, invalid(field+".port", "is required (1-65535)")
	case svc.Protocol == lbdv1.Protocol_PROTOCOL_SCTP && nb.Port != svc.Port:
		// SCTP's CRC32c covers the ports: translating one would mean recomputing it
		// over the whole packet, on every packet, in both directions.
		return nil, model.Backend{}, invalid(field+".port", "%d must be the SCTP service's port %d: lbd does not translate SCTP ports", nb.Port, svc.Port)
	}
	if n := len(nb.QuicServerId); n > 0 {
		switch {
		case svc.Quic == nil:
			return nil, model.Backend{}, invalid(field+".quic_server_id", "the service has no QUIC routing (service.quic)")
		case uint32(n) != svc.Quic.ServerIdLength:
			return nil, model.Backend{}, invalid(field+".quic_server_id", "%x is %d bytes, the service's server IDs are %d", nb.QuicServerId, n, svc.Quic.ServerIdLength)
		}
	}
	node := addr
	if nb.NodeAddress != "" {
		if node, err = parseAddr(field+".node_address", nb.NodeAddress); err != nil {
			return nil, model.Backend{}, err
		}
	}
	if node == addr {
		nb.NodeAddress = nb.Address
	} else {
		nb.NodeAddress = node.String()
	}
	if nb.Weight == 0 {
		nb.Weight = 1
	}
	if nb.Weight > maglev.MaxWeight {
		return nil, model.Backend{}, invalid(field+".weight", "%d exceeds the maximum weight %d", nb.Weight, maglev.MaxWeight)
	}
	switch nb.State {
	case lbdv1.BackendState_BACKEND_STATE_UNSPECIFIED:
		nb.State = lbdv1.BackendState_BACKEND_STATE_ACTIVE
	case lbdv1.BackendState_BACKEND_STATE_ACTIVE, lbdv1.BackendState_BACKEND_STATE_DRAINING, lbdv1.BackendState_BACKEND_STATE_DISABLED:
	default:
		return nil, model.Backend{}, invalid(field+".state", "unknown state %d", nb.State)
	}
	return nb, model.Backend{Addr: netip.AddrPortFrom(addr, uint16(nb.Port)), Node: node}, nil
}

// sortBackends sorts a service's backends, and their addresses with them, by address
// and port.
func sortBackends(svc *model.Service) {
	if slices.IsSortedFunc(svc.Backends, func(a, b model.Backend) int { return a.Addr.Compare(b.Addr) }) {
		return
	}
	idx := make([]int, len(svc.Backends))
	for i := range idx {
		idx[i] = i
	}
	slices.SortFunc(idx, func(i, j int) int { return svc.Backends[i].Addr.Compare(svc.Backends[j].Addr) })
	specs, addrs := slices.Clone(svc.Spec.Backends), slices.Clone(svc.Backends)
	for to, from := range idx {
		svc.Spec.Backends[to], svc.Backends[to] = specs[from], addrs[from]
	}
}

// frontendKey identifies a service's frontend; two services may not share one.
type frontendKey struct {
	vip   netip.Addr
	port  uint32
	proto lbdv1.Protocol
}

func frontendOf(s *model.Service) frontendKey {
	return frontendKey{s.VIP, s.Spec.Port, s.Spec.Protocol}
}

func (k frontendKey) String() string {
	p := "tcp"
	switch k.proto {
	case lbdv1.Protocol_PROTOCOL_UDP:
		p = "udp"
	case lbdv1.Protocol_PROTOCOL_SCTP:
		p = "sctp"
	}
	return fmt.Sprintf("%s/%s", netip.AddrPortFrom(k.vip, uint16(k.port)), p)
}

// parsePeerRef parses the address that names a BGP peer in a request.
func parsePeerRef(address string) (netip.Addr, error) {
	a, err := netip.ParseAddr(address)
	if err != nil {
		return netip.Addr{}, invalid("address", "%q is not an IP address", address)
	}
	return a.Unmap(), nil
}

// normalizePeer validates a BGP peer and fills its defaults; it returns the peer's
// address parsed, which is its key.
func normalizePeer(p *lbdv1.BgpPeer) (*lbdv1.BgpPeer, netip.Addr, *Error) {
	if p == nil {
		return nil, netip.Addr{}, invalid("peer", "is required")
	}
	np := proto.Clone(p).(*lbdv1.BgpPeer)
	np.Status = nil
	addr, perr := netip.ParseAddr(np.Address)
	if perr != nil || addr.Zone() != "" || addr.IsUnspecified() || addr.IsMulticast() {
		return nil, netip.Addr{}, invalid("peer.address", "%q is not a unicast IP address", np.Address)
	}
	addr = addr.Unmap()
	np.Address = addr.String()
	if np.PeerAs == 0 || np.PeerAs == 4294967295 {
		return nil, netip.Addr{}, invalid("peer.peer_as", "%d is not a valid AS number (1-4294967294)", np.PeerAs)
	}
	if np.Port == 0 {
		np.Port = 179
	}
	if err := validPort("peer.port", np.Port); err != nil {
		return nil, netip.Addr{}, err
	}
	if len(np.Password) > 80 {
		return nil, netip.Addr{}, invalid("peer.password", "TCP MD5 keys are at most 80 characters")
	}
	hold, err := durationOr("peer.hold_time", np.HoldTime, 90*time.Second)
	if err != nil {
		return nil, netip.Addr{}, err
	}
	if hold < 3*time.Second || hold > 65535*time.Second || hold%time.Second != 0 {
		return nil, netip.Addr{}, invalid("peer.hold_time", "%v must be whole seconds from 3s to 65535s", hold)
	}
	keep, err := durationOr("peer.keepalive_interval", np.KeepaliveInterval, hold/3)
	if err != nil {
		return nil, netip.Addr{}, err
	}
	if keep < time.Second || keep >= hold || keep%time.Second != 0 {
		return nil, netip.Addr{}, invalid("peer.keepalive_interval", "%v must be whole seconds, at least 1s and below the hold time %v", keep, hold)
	}
	np.HoldTime, np.KeepaliveInterval = durationpb.New(hold), durationpb.New(keep)
	if np.EbgpMultihopTtl > 255 {
		return nil, netip.Addr{}, invalid("peer.ebgp_multihop_ttl", "%d exceeds 255", np.EbgpMultihopTtl)
	}
	if np.GracefulRestart {
		gr, err := durationOr("peer.graceful_restart_time", np.GracefulRestartTime, 120*time.Second)
		if err != nil {
			return nil, netip.Addr{}, err
		}
		if gr < time.Second || gr > 4095*time.Second || gr%time.Second != 0 {
			return nil, netip.Addr{}, invalid("peer.graceful_restart_time", "%v must be whole seconds from 1s to 4095s", gr)
		}
		np.GracefulRestartTime = durationpb.New(gr)
	} else if np.GracefulRestartTime != nil {
		return nil, netip.Addr{}, invalid("peer.graceful_restart_time", "is only meaningful with graceful_restart")
	}
	return np, addr, nil
}
