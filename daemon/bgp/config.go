package bgp

import (
	"cmp"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Defaults applied to zero values of a PeerConfig.
const (
	DefaultPeerPort     = 179
	DefaultHoldTime     = 90 * time.Second
	DefaultConnectRetry = 5 * time.Second
	DefaultRestartTime  = 120 * time.Second
)

// Sentinel errors, so that callers (the API layer) can map them to status codes.
var (
	ErrInvalidConfig = errors.New("invalid BGP configuration")
	ErrPeerExists    = errors.New("peer already configured")
	ErrPeerNotFound  = errors.New("peer not configured")
	ErrNotStarted    = errors.New("BGP speaker not started")
	ErrStarted       = errors.New("BGP speaker already started (it starts once)")
)

// Family is an address family (AFI/SAFI pair) a session can carry.
type Family string

// The families lbd advertises VIPs in.
const (
	IPv4Unicast Family = "ipv4-unicast"
	IPv6Unicast Family = "ipv6-unicast"
)

// Config is the node-wide BGP configuration.
type Config struct {
	// RouterID is the BGP identifier; it must be an IPv4 address, unique per node.
	RouterID netip.Addr
	// LocalAS is this node's autonomous system number (4-byte ASNs allowed).
	LocalAS uint32
	// ListenPort enables the BGP listener when non-zero. Zero keeps it off: the
	// speaker then only connects out, which is what an LB node next to a router
	// wants and avoids clashing with a routing daemon on port 179.
	ListenPort uint16
	// ListenAddresses restricts the listener; empty means all addresses.
	ListenAddresses []netip.Addr
	// NextHopIPv4 and NextHopIPv6 are the next hops announced for VIPs of each
	// family ("next hop self": the node's own address). When unset, the local
	// address of each session is used, which only works for the session's
	// own family.
	NextHopIPv4 netip.Addr
	NextHopIPv6 netip.Addr
	// Restarting says that this start follows a graceful restart of the daemon:
	// OPEN messages carry the Restart State and Forwarding State bits, so peers
	// that kept the old routes as stale keep forwarding until the new ones
	// arrive, and advertisement is deferred until every peer sent End-of-RIB.
	Restarting bool
	// Peers are the sessions configured at start.
	Peers []PeerConfig
}

// PeerConfig describes one BGP neighbor.
type PeerConfig struct {
	// Address is the neighbor's IPv4 or IPv6 address; it identifies the peer.
	Address netip.Addr
	// AS is the neighbor's AS number; equal to the local AS makes an iBGP session.
	AS uint32
	// Port is the neighbor's TCP port (default 179).
	Port uint16
	// LocalAddress is the source address of the session (default: chosen by routing).
	LocalAddress netip.Addr
	// Password enables TCP MD5 signatures (RFC 2385) when set.
	Password string
	// HoldTime (default 90 s) and KeepaliveInterval (default HoldTime/3), whole seconds.
	HoldTime          time.Duration
	KeepaliveInterval time.Duration
	// ConnectRetry is the wait between connection attempts (default 5 s).
	ConnectRetry time.Duration
	// EBGPMultihopTTL allows an eBGP neighbor that many hops away; 0 means
	// directly connected (TTL 1).
	EBGPMultihopTTL uint8
	// Passive waits for the neighbor to connect instead of connecting out; it
	// needs the listener (Config.ListenPort).
	Passive bool
	// GracefulRestart enables the graceful restart capability (RFC 4724).
	GracefulRestart GracefulRestartConfig
	// Families lists the families of the session; default: the family of Address.
	Families []Family
}

// GracefulRestartConfig configures RFC 4724 graceful restart for one peer.
type GracefulRestartConfig struct {
	Enabled bool
	// RestartTime is how long the peer should keep our routes while we restart
	// (default 120 s, at most 4095 s, whole seconds).
	RestartTime time.Duration
}

// Route is one VIP prefix to advertise, with its attributes.
type Route struct {
	// Prefix is the VIP, normally a /32 or /128.
	Prefix           netip.Prefix
	Communities      []Community
	LargeCommunities []LargeCommunity
	// MED is sent when set.
	MED *uint32
}

// Community is a standard BGP community (RFC 1997), AS:value.
type Community uint32

// Well-known communities accepted by name in ParseCommunity.
const (
	CommunityNoExport    Community = 0xFFFFFF01
	CommunityNoAdvertise Community = 0xFFFFFF02
)

// ParseCommunity parses "AS:value" (two 16-bit numbers), "no-export" or "no-advertise".
func ParseCommunity(s string) (Community, error) {
	switch s {
	case "no-export":
		return CommunityNoExport, nil
	case "no-advertise":
		return CommunityNoAdvertise, nil
	}
	hi, lo, ok := strings.Cut(s, ":")
	if !ok {
		return 0, fmt.Errorf("parse community %q: want AS:value", s)
	}
	h, err := strconv.ParseUint(hi, 10, 16)
	if err != nil {
		return 0, fmt.Errorf("parse community %q: %w", s, err)
	}
	l, err := strconv.ParseUint(lo, 10, 16)
	if err != nil {
		return 0, fmt.Errorf("parse community %q: %w", s, err)
	}
	return Community(h<<16 | l), nil
}

func (c Community) String() string {
	return fmt.Sprintf("%d:%d", uint32(c)>>16, uint32(c)&0xFFFF)
}

// LargeCommunity is a large BGP community (RFC 8092), global:local1:local2.
type LargeCommunity struct {
	GlobalAdmin, LocalData1, LocalData2 uint32
}

// ParseLargeCommunity parses "global:local1:local2" (three 32-bit numbers).
func ParseLargeCommunity(s string) (LargeCommunity, error) {
	parts := strings.Split(s, ":")
	if len(parts) != 3 {
		return LargeCommunity{}, fmt.Errorf("parse large community %q: want global:local1:local2", s)
	}
	var v [3]uint32
	for i, p := range parts {
		n, err := strconv.ParseUint(p, 10, 32)
		if err != nil {
			return LargeCommunity{}, fmt.Errorf("parse large community %q: %w", s, err)
		}
		v[i] = uint32(n)
	}
	return LargeCommunity{v[0], v[1], v[2]}, nil
}

func (c LargeCommunity) String() string {
	return fmt.Sprintf("%d:%d:%d", c.GlobalAdmin, c.LocalData1, c.LocalData2)
}

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalidConfig, fmt.Sprintf(format, args...))
}

// Validate checks the node configuration and every peer in it.
func (c *Config) Validate() error {
	if !c.RouterID.IsValid() || !c.RouterID.Is4() || c.RouterID.IsUnspecified() {
		return invalid("router ID %q: must be a non-zero IPv4 address", addrString(c.RouterID))
	}
	if c.LocalAS == 0 {
		return invalid("local AS: must not be 0")
	}
	for _, a := range c.ListenAddresses {
		if !a.IsValid() {
			return invalid("listen address: not an IP address")
		}
	}
	if len(c.ListenAddresses) > 0 && c.ListenPort == 0 {
		return invalid("listen addresses given but listen port is 0 (listener disabled)")
	}
	if c.NextHopIPv4.IsValid() && (!c.NextHopIPv4.Is4() || c.NextHopIPv4.IsUnspecified()) {
		return invalid("IPv4 next hop %s: must be a non-zero IPv4 address", c.NextHopIPv4)
	}
	if c.NextHopIPv6.IsValid() && (!c.NextHopIPv6.Is6() || c.NextHopIPv6.Is4In6() || c.NextHopIPv6.IsUnspecified()) {
		return invalid("IPv6 next hop %s: must be a non-zero IPv6 address", c.NextHopIPv6)
	}
	seen := make(map[netip.Addr]bool, len(c.Peers))
	for i := range c.Peers {
		p := &c.Peers[i]
		if err := c.validatePeer(p); err != nil {
			return err
		}
		if seen[p.Address.Unmap()] {
			return fmt.Errorf("%w: %s", ErrPeerExists, p.Address)
		}
		seen[p.Address.Unmap()] = true
	}
	return nil
}

// validatePeer checks one peer against the node configuration.
func (c *Config) validatePeer(p *PeerConfig) error {
	if !p.Address.IsValid() {
		return invalid("peer address: not an IP address")
	}
	a := p.Address.Unmap()
	if a.IsUnspecified() || a.IsMulticast() || (a.Is6() && a.Zone() != "") {
		return invalid("peer address %s: must be a unicast address without zone", p.Address)
	}
	if p.AS == 0 {
		return invalid("peer %s: AS must not be 0", p.Address)
	}
	if p.LocalAddress.IsValid() && p.LocalAddress.Unmap().Is4() != a.Is4() {
		return invalid("peer %s: local address %s is of another family", p.Address, p.LocalAddress)
	}
	if err := validateTimers(p); err != nil {
		return err
	}
	if p.Passive && c.ListenPort == 0 {
		return invalid("peer %s: passive needs the listener (listen port)", p.Address)
	}
	if gr := p.GracefulRestart; gr.RestartTime != 0 {
		if !gr.Enabled {
			return invalid("peer %s: restart time set but graceful restart disabled", p.Address)
		}
		if err := wholeSeconds("restart time", p.Address, gr.RestartTime, 1, 4095); err != nil {
			return err
		}
	}
	for i, f := range p.Families {
		if f != IPv4Unicast && f != IPv6Unicast {
			return invalid("peer %s: unknown family %q (want %s or %s)", p.Address, f, IPv4Unicast, IPv6Unicast)
		}
		if slices.Contains(p.Families[:i], f) {
			return invalid("peer %s: family %s listed twice", p.Address, f)
		}
		// Over a session of the other family the local address cannot be the
		// next hop, so the node's address of that family must be configured.
		if f == IPv4Unicast && !a.Is4() && !c.NextHopIPv4.IsValid() {
			return invalid("peer %s: %s over IPv6 needs the IPv4 next hop configured", p.Address, f)
		}
		if f == IPv6Unicast && a.Is4() && !c.NextHopIPv6.IsValid() {
			return invalid("peer %s: %s over IPv4 needs the IPv6 next hop configured", p.Address, f)
		}
	}
	return nil
}

func validateTimers(p *PeerConfig) error {
	if p.HoldTime != 0 {
		// RFC 4271 4.2: a hold time is 0 or at least 3 seconds; 0 (no keepalives)
		// is not offered since a dead LB node must be noticed.
		if err := wholeSeconds("hold time", p.Address, p.HoldTime, 3, 65535); err != nil {
			return err
		}
	}
	if p.KeepaliveInterval != 0 {
		if err := wholeSeconds("keepalive interval", p.Address, p.KeepaliveInterval, 1, 21845); err != nil {
			return err
		}
		hold := p.HoldTime
		if hold == 0 {
			hold = DefaultHoldTime
		}
		if p.KeepaliveInterval >= hold {
			return invalid("peer %s: keepalive interval %s must be shorter than hold time %s",
				p.Address, p.KeepaliveInterval, hold)
		}
	}
	if p.ConnectRetry != 0 {
		if err := wholeSeconds("connect retry", p.Address, p.ConnectRetry, 1, 65535); err != nil {
			return err
		}
	}
	return nil
}

func wholeSeconds(what string, peer netip.Addr, d time.Duration, minSec, maxSec int64) error {
	if d%time.Second != 0 || d < time.Duration(minSec)*time.Second || d > time.Duration(maxSec)*time.Second {
		return invalid("peer %s: %s %s: must be whole seconds in [%d, %d]", peer, what, d, minSec, maxSec)
	}
	return nil
}

// withDefaults returns a copy of p with zero values replaced by defaults.
func (p PeerConfig) withDefaults() PeerConfig {
	p.Address = p.Address.Unmap()
	p.LocalAddress = p.LocalAddress.Unmap()
	if p.Port == 0 {
		p.Port = DefaultPeerPort
	}
	if p.HoldTime == 0 {
		p.HoldTime = DefaultHoldTime
	}
	if p.KeepaliveInterval == 0 {
		p.KeepaliveInterval = (p.HoldTime / 3).Truncate(time.Second)
	}
	if p.ConnectRetry == 0 {
		p.ConnectRetry = DefaultConnectRetry
	}
	if p.GracefulRestart.Enabled && p.GracefulRestart.RestartTime == 0 {
		p.GracefulRestart.RestartTime = DefaultRestartTime
	}
	if len(p.Families) == 0 {
		p.Families = []Family{IPv4Unicast}
		if p.Address.Is6() {
			p.Families = []Family{IPv6Unicast}
		}
	} else {
		p.Families = slices.Clone(p.Families)
	}
	return p
}

func (p PeerConfig) equal(o PeerConfig) bool {
	return p.Address == o.Address && p.AS == o.AS && p.Port == o.Port &&
		p.LocalAddress == o.LocalAddress && p.Password == o.Password &&
		p.HoldTime == o.HoldTime && p.KeepaliveInterval == o.KeepaliveInterval &&
		p.ConnectRetry == o.ConnectRetry && p.EBGPMultihopTTL == o.EBGPMultihopTTL &&
		p.Passive == o.Passive && p.GracefulRestart == o.GracefulRestart &&
		slices.Equal(p.Families, o.Families)
}

// validateRoutes checks a desired set: valid, masked, unique prefixes whose
// family has a usable next hop.
func validateRoutes(routes []Route) error {
	seen := make(map[netip.Prefix]bool, len(routes))
	for _, r := range routes {
		if !r.Prefix.IsValid() {
			return invalid("route prefix: not a valid prefix")
		}
		if r.Prefix.Addr().Is4In6() {
			return invalid("route %s: IPv4-mapped addresses are not allowed", r.Prefix)
		}
		if r.Prefix != r.Prefix.Masked() {
			return invalid("route %s: host bits set (want %s)", r.Prefix, r.Prefix.Masked())
		}
		if seen[r.Prefix] {
			return invalid("route %s: listed twice", r.Prefix)
		}
		seen[r.Prefix] = true
	}
	return nil
}

// normalized returns r with attributes sorted and deduplicated, so that two
// routes that announce the same thing compare equal.
func (r Route) normalized() Route {
	r.Communities = slices.Clone(r.Communities)
	slices.Sort(r.Communities)
	r.Communities = slices.Compact(r.Communities)
	r.LargeCommunities = slices.Clone(r.LargeCommunities)
	slices.SortFunc(r.LargeCommunities, compareLarge)
	r.LargeCommunities = slices.Compact(r.LargeCommunities)
	if r.MED != nil {
		m := *r.MED
		r.MED = &m
	}
	if len(r.Communities) == 0 {
		r.Communities = nil
	}
	if len(r.LargeCommunities) == 0 {
		r.LargeCommunities = nil
	}
	return r
}

func compareLarge(a, b LargeCommunity) int {
	if c := cmp.Compare(a.GlobalAdmin, b.GlobalAdmin); c != 0 {
		return c
	}
	if c := cmp.Compare(a.LocalData1, b.LocalData1); c != 0 {
		return c
	}
	return cmp.Compare(a.LocalData2, b.LocalData2)
}

// sameAttributes reports whether two normalized routes announce the same attributes.
func sameAttributes(a, b Route) bool {
	if (a.MED == nil) != (b.MED == nil) || (a.MED != nil && *a.MED != *b.MED) {
		return false
	}
	return slices.Equal(a.Communities, b.Communities) && slices.Equal(a.LargeCommunities, b.LargeCommunities)
}

func addrString(a netip.Addr) string {
	if !a.IsValid() {
		return ""
	}
	return a.String()
}
