package advertise

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"time"

	"github.com/lbd-dev/lbd/daemon/bgp"
)

// Config is the `bgp:` section of lbd's configuration file. Field names are the file's
// keys; every field is checked by Validate.
type Config struct {
	// RouterID is this node's BGP identifier: an IPv4 address, unique per node.
	RouterID string `json:"router_id"`
	// LocalAS is this node's AS number.
	LocalAS uint32 `json:"local_as"`
	// ListenPort enables the BGP listener (needed by passive peers); 0 keeps it off so
	// the node only connects out and never clashes with a routing daemon on port 179.
	ListenPort uint32 `json:"listen_port"`
	// NextHopV4 and NextHopV6 are the next hops announced for VIPs of each family
	// (normally the node's own address). Unset, each session's local address is used,
	// which only works for VIPs of the session's own family.
	NextHopV4 string `json:"next_hop_v4"`
	NextHopV6 string `json:"next_hop_v6"`
	// Peers are the static peers. The API cannot change or delete them.
	Peers []Peer `json:"peers"`
	// VIPAttributes gives path attributes to the VIPs inside a prefix; the first entry
	// whose prefix contains a VIP applies.
	VIPAttributes []VIPAttributes `json:"vip_attributes"`
}

// Peer is one static BGP neighbor.
type Peer struct {
	Address string `json:"address"`
	AS      uint32 `json:"as"`
	// Port is the neighbor's TCP port; 0 means 179.
	Port uint32 `json:"port"`
	// Password enables TCP MD5 signatures (RFC 2385).
	Password string `json:"password"`
	// HoldTime (default 90s) and KeepaliveInterval (default a third of the hold time),
	// whole seconds.
	HoldTime          Duration `json:"hold_time"`
	KeepaliveInterval Duration `json:"keepalive_interval"`
	// ConnectRetry is the wait between connection attempts (default 5s).
	ConnectRetry Duration `json:"connect_retry"`
	// EBGPMultihopTTL allows an eBGP neighbor that many hops away; 0 means directly
	// connected.
	EBGPMultihopTTL uint32 `json:"ebgp_multihop_ttl"`
	// Passive waits for the neighbor to connect; it needs listen_port.
	Passive         bool            `json:"passive"`
	GracefulRestart GracefulRestart `json:"graceful_restart"`
	// Families are "ipv4-unicast" and/or "ipv6-unicast". Default: the family of the
	// address, plus the other one when its next hop is configured.
	Families []string `json:"families"`
}

// GracefulRestart configures RFC 4724 graceful restart for a peer: with it, a daemon
// restart leaves the router's routes (and its ECMP set) untouched.
type GracefulRestart struct {
	Enabled bool `json:"enabled"`
	// RestartTime is how long the peer keeps our routes while lbd restarts (default
	// 120s, at most 4095s).
	RestartTime Duration `json:"restart_time"`
}

// VIPAttributes are the path attributes of the VIPs within Prefix.
type VIPAttributes struct {
	// Prefix is a CIDR prefix, e.g. "203.0.113.0/24".
	Prefix string `json:"prefix"`
	// Communities are "AS:value", "no-export" or "no-advertise".
	Communities []string `json:"communities"`
	// LargeCommunities are "global:local1:local2".
	LargeCommunities []string `json:"large_communities"`
	// MED is sent when set.
	MED *uint32 `json:"med"`
}

// Duration is a time.Duration written as a Go duration string ("90s").
type Duration time.Duration

// UnmarshalJSON parses a duration string.
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("duration must be a string like \"90s\": %w", err)
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("parse duration: %w", err)
	}
	*d = Duration(v)
	return nil
}

// MarshalJSON writes a duration string.
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(time.Duration(d).String()) }

// attributes is a parsed VIPAttributes entry.
type attributes struct {
	prefix      netip.Prefix
	communities []bgp.Community
	large       []bgp.LargeCommunity
	med         *uint32
}

// Validate checks the section; each error names its field (e.g. bgp.peers[1].as).
func (c *Config) Validate() error {
	_, _, err := c.compile(false)
	return err
}

// BGPConfig returns the speaker configuration for c, with the static peers only.
// restarting marks a start that follows a graceful restart of the daemon.
func (c *Config) BGPConfig(restarting bool) (bgp.Config, error) {
	bc, _, err := c.compile(restarting)
	return bc, err
}

// compile validates c and converts it. Field errors are collected so that an operator
// sees them all at once; the speaker's own validation runs last, on a config that
// passed ours, to catch combinations (e.g. a family without its next hop).
func (c *Config) compile(restarting bool) (bgp.Config, []attributes, error) {
	var errs []error
	fail := func(field, format string, args ...any) {
		errs = append(errs, fmt.Errorf("bgp.%s: %s", field, fmt.Sprintf(format, args...)))
	}
	bc := bgp.Config{LocalAS: c.LocalAS, Restarting: restarting}
	if a, err := netip.ParseAddr(c.RouterID); err != nil || !a.Is4() || a.IsUnspecified() {
		fail("router_id", "%q is not a non-zero IPv4 address", c.RouterID)
	} else {
		bc.RouterID = a
	}
	if c.LocalAS == 0 || c.LocalAS == 4294967295 {
		fail("local_as", "%d is not a valid AS number (1-4294967294)", c.LocalAS)
	}
	if c.ListenPort > 65535 {
		fail("listen_port", "%d exceeds 65535", c.ListenPort)
	} else {
		bc.ListenPort = uint16(c.ListenPort)
	}
	parseNextHop := func(field, s string, v4 bool) netip.Addr {
		if s == "" {
			return netip.Addr{}
		}
		a, err := netip.ParseAddr(s)
		if err != nil || a.Is4() != v4 || a.Is4In6() || a.IsUnspecified() || a.Zone() != "" {
			fail(field, "%q is not a non-zero %s address", s, map[bool]string{true: "IPv4", false: "IPv6"}[v4])
			return netip.Addr{}
		}
		return a
	}
	bc.NextHopIPv4 = parseNextHop("next_hop_v4", c.NextHopV4, true)
	bc.NextHopIPv6 = parseNextHop("next_hop_v6", c.NextHopV6, false)
	seen := map[netip.Addr]int{}
	for i, p := range c.Peers {
		pc, perrs := p.compile(fmt.Sprintf("peers[%d]", i), bc, c.ListenPort != 0)
		errs = append(errs, perrs...)
		if len(perrs) > 0 {
			continue
		}
		if j, dup := seen[pc.Address]; dup {
			fail(fmt.Sprintf("peers[%d].address", i), "%s is already configured as peers[%d]", pc.Address, j)
			continue
		}
		seen[pc.Address] = i
		bc.Peers = append(bc.Peers, pc)
	}
	attrs := make([]attributes, 0, len(c.VIPAttributes))
	for i, va := range c.VIPAttributes {
		a, aerrs := va.compile(fmt.Sprintf("vip_attributes[%d]", i))
		errs = append(errs, aerrs...)
		attrs = append(attrs, a)
	}
	if len(errs) > 0 {
		return bgp.Config{}, nil, errors.Join(errs...)
	}
	if err := bc.Validate(); err != nil {
		return bgp.Config{}, nil, fmt.Errorf("bgp: %w", err)
	}
	return bc, attrs, nil
}

// compile checks one static peer; node gives the next hops and the local AS.
func (p Peer) compile(field string, node bgp.Config, listening bool) (bgp.PeerConfig, []error) {
	var errs []error
	fail := func(sub, format string, args ...any) {
		errs = append(errs, fmt.Errorf("bgp.%s.%s: %s", field, sub, fmt.Sprintf(format, args...)))
	}
	var pc bgp.PeerConfig
	a, err := netip.ParseAddr(p.Address)
	if err != nil || a.Zone() != "" || a.Unmap().IsUnspecified() || a.IsMulticast() {
		fail("address", "%q is not a unicast IP address", p.Address)
	}
	pc.Address = a.Unmap()
	if p.AS == 0 || p.AS == 4294967295 {
		fail("as", "%d is not a valid AS number (1-4294967294)", p.AS)
	}
	pc.AS = p.AS
	if p.Port > 65535 {
		fail("port", "%d exceeds 65535", p.Port)
	}
	pc.Port = uint16(p.Port)
	if len(p.Password) > 80 {
		fail("password", "TCP MD5 keys are at most 80 characters")
	}
	pc.Password = p.Password
	hold := time.Duration(p.HoldTime)
	if hold != 0 && (hold < 3*time.Second || hold > 65535*time.Second || hold%time.Second != 0) {
		fail("hold_time", "%v must be whole seconds from 3s to 65535s", hold)
	}
	pc.HoldTime = hold
	keep := time.Duration(p.KeepaliveInterval)
	if hold == 0 {
		hold = bgp.DefaultHoldTime
	}
	if keep != 0 && (keep < time.Second || keep >= hold || keep%time.Second != 0) {
		fail("keepalive_interval", "%v must be whole seconds, at least 1s and below the hold time %v", keep, hold)
	}
	pc.KeepaliveInterval = keep
	retry := time.Duration(p.ConnectRetry)
	if retry != 0 && (retry < time.Second || retry > 65535*time.Second || retry%time.Second != 0) {
		fail("connect_retry", "%v must be whole seconds from 1s to 65535s", retry)
	}
	pc.ConnectRetry = retry
	if p.EBGPMultihopTTL > 255 {
		fail("ebgp_multihop_ttl", "%d exceeds 255", p.EBGPMultihopTTL)
	}
	pc.EBGPMultihopTTL = uint8(p.EBGPMultihopTTL)
	if p.Passive && !listening {
		fail("passive", "a passive peer needs the listener (set bgp.listen_port)")
	}
	pc.Passive = p.Passive
	gr := time.Duration(p.GracefulRestart.RestartTime)
	switch {
	case gr != 0 && !p.GracefulRestart.Enabled:
		fail("graceful_restart.restart_time", "is only meaningful with graceful_restart.enabled")
	case gr != 0 && (gr < time.Second || gr > 4095*time.Second || gr%time.Second != 0):
		fail("graceful_restart.restart_time", "%v must be whole seconds from 1s to 4095s", gr)
	}
	pc.GracefulRestart = bgp.GracefulRestartConfig{Enabled: p.GracefulRestart.Enabled, RestartTime: gr}
	for i, f := range p.Families {
		fam := bgp.Family(f)
		if fam != bgp.IPv4Unicast && fam != bgp.IPv6Unicast {
			fail(fmt.Sprintf("families[%d]", i), "%q is not %s or %s", f, bgp.IPv4Unicast, bgp.IPv6Unicast)
			continue
		}
		if slices.Contains(pc.Families, fam) {
			fail(fmt.Sprintf("families[%d]", i), "%s is listed twice", f)
			continue
		}
		pc.Families = append(pc.Families, fam)
	}
	if len(errs) > 0 {
		return bgp.PeerConfig{}, errs
	}
	if len(pc.Families) == 0 {
		pc.Families = defaultFamilies(pc.Address, node)
	}
	return pc, nil
}

// defaultFamilies is the family of the peer's address, plus the other family when the
// node has a next hop of that family: then one session carries VIPs of both.
func defaultFamilies(addr netip.Addr, node bgp.Config) []bgp.Family {
	if addr.Is4() {
		if node.NextHopIPv6.IsValid() {
			return []bgp.Family{bgp.IPv4Unicast, bgp.IPv6Unicast}
		}
		return []bgp.Family{bgp.IPv4Unicast}
	}
	if node.NextHopIPv4.IsValid() {
		return []bgp.Family{bgp.IPv4Unicast, bgp.IPv6Unicast}
	}
	return []bgp.Family{bgp.IPv6Unicast}
}

func (va VIPAttributes) compile(field string) (attributes, []error) {
	var errs []error
	fail := func(sub, format string, args ...any) {
		errs = append(errs, fmt.Errorf("bgp.%s.%s: %s", field, sub, fmt.Sprintf(format, args...)))
	}
	a := attributes{med: va.MED}
	p, err := netip.ParsePrefix(va.Prefix)
	switch {
	case err != nil:
		fail("prefix", "%q is not a CIDR prefix", va.Prefix)
	case p != p.Masked():
		fail("prefix", "%q has host bits set (want %s)", va.Prefix, p.Masked())
	default:
		a.prefix = p
	}
	for i, s := range va.Communities {
		c, err := bgp.ParseCommunity(s)
		if err != nil {
			fail(fmt.Sprintf("communities[%d]", i), "%q is not AS:value (16-bit numbers), no-export or no-advertise", s)
			continue
		}
		a.communities = append(a.communities, c)
	}
	for i, s := range va.LargeCommunities {
		c, err := bgp.ParseLargeCommunity(s)
		if err != nil {
			fail(fmt.Sprintf("large_communities[%d]", i), "%q is not global:local1:local2 (32-bit numbers)", s)
			continue
		}
		a.large = append(a.large, c)
	}
	return a, errs
}

// route returns the route of a VIP with the attributes of the first entry containing it.
func route(vip netip.Addr, attrs []attributes) bgp.Route {
	r := bgp.Route{Prefix: netip.PrefixFrom(vip, vip.BitLen())}
	for _, a := range attrs {
		if a.prefix.Contains(vip) {
			r.Communities = a.communities
			r.LargeCommunities = a.large
			r.MED = a.med
			break
		}
	}
	return r
}
