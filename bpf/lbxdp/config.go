//go:build linux

package lbxdp

import (
	"fmt"
	"net"
	"net/netip"
	"time"

	"github.com/cilium/ebpf"
)

// Config is the node-wide datapath configuration.
type Config struct {
	// HashSeed feeds the flow hash. Every LB node must use the same seed (and
	// the same tables) to choose the same backend for a flow.
	HashSeed uint32
	// VNI of the Geneve header (24 bits).
	VNI uint32
	// Source4 and Source6 are the outer source addresses for IPv4 and IPv6
	// underlays. When unset, the FIB picks the route's preferred source.
	Source4 netip.Addr
	Source6 netip.Addr
	// Conntrack timeouts by state (whole seconds).
	TCPSynTimeout         time.Duration
	TCPEstablishedTimeout time.Duration
	TCPClosingTimeout     time.Duration
	UDPTimeout            time.Duration
	// SCTP associations: handshake (INIT or COOKIE ECHO seen), established,
	// closing (SHUTDOWN, SHUTDOWN ACK, ABORT or SHUTDOWN COMPLETE seen).
	SCTPInitTimeout        time.Duration
	SCTPEstablishedTimeout time.Duration
	SCTPClosingTimeout     time.Duration
	// TentativeTimeout applies to an entry created by a packet other than a TCP
	// SYN (a mid-connection TCP packet, a first UDP datagram) until a later packet
	// of the flow confirms it.
	TentativeTimeout time.Duration
	// GuardRate is the flood guard: how many new flows a second each CPU records
	// in conntrack. Past it, new flows are balanced by the Maglev table alone
	// (and counted, CTGuardSkipped), so that a flood of new sources cannot fill
	// the table. 0: no limit.
	GuardRate uint32
}

// DefaultConfig is written when Load creates a fresh config map.
func DefaultConfig() Config {
	return Config{
		VNI:                   2,
		TCPSynTimeout:         60 * time.Second,
		TCPEstablishedTimeout: 6 * time.Hour,
		TCPClosingTimeout:     10 * time.Second,
		UDPTimeout:            60 * time.Second,
		// SCTP sends a heartbeat every 30 s on an idle path (RFC 9260 §8.3): an
		// idle association is still seen long before its entry expires.
		SCTPInitTimeout:        60 * time.Second,
		SCTPEstablishedTimeout: 6 * time.Hour,
		SCTPClosingTimeout:     10 * time.Second,
		TentativeTimeout:       5 * time.Second,
		GuardRate:              DefaultGuardRate,
	}
}

// DefaultGuardRate is the default of Config.GuardRate: far above what one CPU
// sees of legitimate new flows on most edges, far below what it forwards.
const DefaultGuardRate = 100000

func seconds(d time.Duration) (uint32, error) {
	s := d / time.Second
	if d < 0 || s > 1<<32-1 {
		return 0, fmt.Errorf("timeout %v: %w", d, ErrRange)
	}
	return uint32(s), nil
}

// SetConfig replaces the configuration.
func (d *Datapath) SetConfig(c Config) error {
	if c.VNI >= 1<<24 {
		return fmt.Errorf("set config: VNI %d: %w", c.VNI, ErrRange)
	}
	v := lbxdpLbConfig{HashSeed: c.HashSeed, Vni: c.VNI, CtGuardRate: c.GuardRate}
	if c.Source4.IsValid() {
		if !c.Source4.Is4() {
			return fmt.Errorf("set config: source4 %v: %w", c.Source4, ErrFamily)
		}
		v.Src4 = c.Source4.As4()
	}
	if c.Source6.IsValid() {
		if !c.Source6.Is6() || c.Source6.Is4In6() {
			return fmt.Errorf("set config: source6 %v: %w", c.Source6, ErrFamily)
		}
		v.Src6 = c.Source6.As16()
	}
	var err error
	for _, t := range []struct {
		dst *uint32
		d   time.Duration
	}{{&v.TcpSynTimeout, c.TCPSynTimeout}, {&v.TcpEstTimeout, c.TCPEstablishedTimeout}, {&v.TcpCloseTimeout, c.TCPClosingTimeout}, {&v.UdpTimeout, c.UDPTimeout}, {&v.TentativeTimeout, c.TentativeTimeout},
		{&v.SctpInitTimeout, c.SCTPInitTimeout}, {&v.SctpEstTimeout, c.SCTPEstablishedTimeout}, {&v.SctpCloseTimeout, c.SCTPClosingTimeout}} {
		if *t.dst, err = seconds(t.d); err != nil {
			return fmt.Errorf("set config: %w", err)
		}
	}
	var old lbxdpLbConfig
	if err := d.objs.LbCfg.Lookup(uint32(0), &old); err != nil {
		return fmt.Errorf("set config: %w", err)
	}
	// Cached routes may depend on the source addresses: resolve them again.
	v.RouteGen = old.RouteGen + 1
	if err := d.update(d.objs.LbCfg, uint32(0), &v, ebpf.UpdateAny); err != nil {
		return fmt.Errorf("set config: %w", err)
	}
	return nil
}

// FlushRouteCache makes the datapath resolve every backend node's route again
// on its next packet. The datapath caches FIB results (next hop, source,
// route MTU) per CPU for half a second; a control plane that watches route
// and neighbour changes can call this to apply them at once.
func (d *Datapath) FlushRouteCache() error {
	var v lbxdpLbConfig
	if err := d.objs.LbCfg.Lookup(uint32(0), &v); err != nil {
		return fmt.Errorf("flush route cache: %w", err)
	}
	v.RouteGen++
	if err := d.update(d.objs.LbCfg, uint32(0), &v, ebpf.UpdateAny); err != nil {
		return fmt.Errorf("flush route cache: %w", err)
	}
	return nil
}

// Config reads the configuration.
func (d *Datapath) Config() (Config, error) {
	var v lbxdpLbConfig
	if err := d.objs.LbCfg.Lookup(uint32(0), &v); err != nil {
		return Config{}, fmt.Errorf("read config: %w", err)
	}
	c := Config{
		HashSeed:               v.HashSeed,
		VNI:                    v.Vni,
		TCPSynTimeout:          time.Duration(v.TcpSynTimeout) * time.Second,
		TCPEstablishedTimeout:  time.Duration(v.TcpEstTimeout) * time.Second,
		TCPClosingTimeout:      time.Duration(v.TcpCloseTimeout) * time.Second,
		UDPTimeout:             time.Duration(v.UdpTimeout) * time.Second,
		SCTPInitTimeout:        time.Duration(v.SctpInitTimeout) * time.Second,
		SCTPEstablishedTimeout: time.Duration(v.SctpEstTimeout) * time.Second,
		SCTPClosingTimeout:     time.Duration(v.SctpCloseTimeout) * time.Second,
		TentativeTimeout:       time.Duration(v.TentativeTimeout) * time.Second,
		GuardRate:              v.CtGuardRate,
	}
	if v.Src4 != [4]byte{} {
		c.Source4 = netip.AddrFrom4(v.Src4)
	}
	if v.Src6 != [16]byte{} {
		c.Source6 = netip.AddrFrom16(v.Src6)
	}
	return c, nil
}

// CachedRoute is the datapath's cached FIB result toward a backend's node on
// one CPU.
type CachedRoute struct {
	CPU     int
	Node    netip.Addr
	Ingress int // ifindex the lookup was made for
	Egress  int
	MTU     uint32
	SrcMAC  net.HardwareAddr
	DstMAC  net.HardwareAddr
	Source  netip.Addr
	Expires time.Duration // MonotonicNow clock
	Stale   bool          // resolved before the last FlushRouteCache or SetConfig
}

// CachedRoutes lists a backend's cached routes, one per CPU that has one.
func (d *Datapath) CachedRoutes(backendID uint32) ([]CachedRoute, error) {
	if err := d.checkBackendID(backendID); err != nil {
		return nil, fmt.Errorf("read route cache: %w", err)
	}
	var per []lbxdpLbRoute
	if err := d.objs.LbFibCache.Lookup(backendID, &per); err != nil {
		return nil, fmt.Errorf("read route cache: %w", err)
	}
	var cfg lbxdpLbConfig
	if err := d.objs.LbCfg.Lookup(uint32(0), &cfg); err != nil {
		return nil, fmt.Errorf("read route cache: %w", err)
	}
	var be lbxdpLbBackend
	if err := d.objs.LbBackends.Lookup(backendID, &be); err != nil {
		return nil, fmt.Errorf("read route cache: %w", err)
	}
	var out []CachedRoute
	for cpu, r := range per {
		if r.ExpiresNs == 0 {
			continue
		}
		// Entries for a node the backend no longer has are ignored by the
		// datapath: show the current node's only.
		if r.Node != be.NodeAddr {
			continue
		}
		node, src := bytesAddr(r.Node, be.NodeFamily), bytesAddr(r.Src, be.NodeFamily)
		out = append(out, CachedRoute{
			CPU: cpu, Node: node, Ingress: int(r.Ingress), Egress: int(r.Ifindex), MTU: r.Mtu,
			SrcMAC: net.HardwareAddr(r.Smac[:]), DstMAC: net.HardwareAddr(r.Dmac[:]), Source: src,
			Expires: time.Duration(r.ExpiresNs), Stale: r.Gen != cfg.RouteGen,
		})
	}
	return out, nil
}
