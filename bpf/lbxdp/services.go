//go:build linux

package lbxdp

import (
	"errors"
	"fmt"
	"net/netip"
	"time"

	"github.com/cilium/ebpf"
)

// Protocol numbers a service can match.
const (
	ProtoTCP  uint8 = 6
	ProtoUDP  uint8 = 17
	ProtoSCTP uint8 = 132
)

// ServiceKey identifies a service: VIP, port (0: all ports) and protocol.
type ServiceKey struct {
	VIP   netip.Addr
	Port  uint16
	Proto uint8
}

// HashMode selects what the Maglev index is computed from.
type HashMode uint8

const (
	// HashFiveTuple hashes addresses, ports and protocol (the default).
	HashFiveTuple HashMode = iota
	// HashSourceAddr hashes the client address only: all flows of a client go
	// to the same backend.
	HashSourceAddr
)

// Service is what the datapath knows about a service.
type Service struct {
	// ID is stable across restarts: conntrack entries, the Maglev table and the
	// counters are keyed by it. Must be below Options.MaxServices.
	ID       uint32
	HashMode HashMode
	// DropNoBackend drops new flows when no backend is usable, instead of
	// answering with a TCP RST or ICMP port unreachable.
	DropNoBackend bool
	// SourceRanges restricts clients to the prefixes added with
	// AddSourceRange; all others are dropped (DropSourceRange).
	SourceRanges bool
	// AffinityTimeout, when nonzero, sends a client's new flows to the backend
	// its previous flow got, for this long after that flow started.
	AffinityTimeout time.Duration
	// QUIC, on a UDP service, routes QUIC packets by the server ID in their
	// connection ID (SetQUICServerID) before the 5-tuple.
	QUIC QUIC
}

// Service flags: enum lb_svc_flag, as bpf2go generates it.
const (
	svcHashSrc   = uint32(lbxdpLbSvcFlagLB_SVC_HASH_SRC)
	svcDropNoBE  = uint32(lbxdpLbSvcFlagLB_SVC_DROP_NO_BE)
	svcSrcRanges = uint32(lbxdpLbSvcFlagLB_SVC_SRC_RANGES)
	svcAffinity  = uint32(lbxdpLbSvcFlagLB_SVC_AFFINITY)
	svcQUIC      = uint32(lbxdpLbSvcFlagLB_SVC_QUIC)
)

// maxAffinitySecs is the largest affinity timeout the map's field holds.
const maxAffinitySecs = 1<<32 - 1

func (k ServiceKey) raw() (lbxdpLbServiceKey, error) {
	addr, fam, err := addrBytes(k.VIP)
	if err != nil {
		return lbxdpLbServiceKey{}, err
	}
	if k.Proto != ProtoTCP && k.Proto != ProtoUDP && k.Proto != ProtoSCTP {
		return lbxdpLbServiceKey{}, fmt.Errorf("protocol %d: %w", k.Proto, ErrRange)
	}
	return lbxdpLbServiceKey{Addr: addr, Port: htons(k.Port), Proto: k.Proto, Family: fam}, nil
}

func (d *Datapath) serviceRaw(s Service) (lbxdpLbService, error) {
	if s.ID >= d.opts.MaxServices {
		return lbxdpLbService{}, fmt.Errorf("service ID %d: %w", s.ID, ErrRange)
	}
	secs := s.AffinityTimeout / time.Second
	if s.AffinityTimeout < 0 || secs > maxAffinitySecs || (s.AffinityTimeout > 0 && secs == 0) {
		return lbxdpLbService{}, fmt.Errorf("affinity timeout %v: %w", s.AffinityTimeout, ErrRange)
	}
	var flags uint32
	if s.HashMode == HashSourceAddr {
		flags |= svcHashSrc
	}
	if s.DropNoBackend {
		flags |= svcDropNoBE
	}
	if s.SourceRanges {
		flags |= svcSrcRanges
	}
	if secs > 0 {
		flags |= svcAffinity
	}
	if err := s.QUIC.check(); err != nil {
		return lbxdpLbService{}, err
	}
	v := lbxdpLbService{Id: s.ID, Flags: flags, AffinityTimeout: uint32(secs)}
	if s.QUIC.ServerIDLen > 0 {
		v.Flags |= svcQUIC
		v.QuicConfigId, v.QuicSidLen = s.QUIC.ConfigID, s.QUIC.ServerIDLen
	}
	return v, nil
}

// UpsertService creates or replaces a service. A new service has no backend
// until SetMaglevTable gives it a table.
func (d *Datapath) UpsertService(k ServiceKey, s Service) error {
	rk, err := k.raw()
	if err != nil {
		return fmt.Errorf("upsert service: %w", err)
	}
	rv, err := d.serviceRaw(s)
	if err != nil {
		return fmt.Errorf("upsert service: %w", err)
	}
	var old lbxdpLbService
	exists := true
	if err := d.objs.LbServices.Lookup(&rk, &old); errors.Is(err, ebpf.ErrKeyNotExist) {
		exists = false
	} else if err != nil {
		return fmt.Errorf("upsert service: %w", err)
	}
	// The VIP entry goes first: the datapath only looks for services on
	// addresses that it lists.
	if !exists {
		if err := d.adjustVIP(rk, 1); err != nil {
			return fmt.Errorf("upsert service: %w", err)
		}
	}
	if err := d.update(d.objs.LbServices, &rk, &rv, ebpf.UpdateAny); err != nil {
		if !exists {
			_ = d.adjustVIP(rk, -1)
		}
		return fmt.Errorf("upsert service: %w", err)
	}
	if exists && old.Id != rv.Id {
		if err := d.unindexService(old.Id, rk); err != nil {
			return fmt.Errorf("upsert service: %w", err)
		}
	}
	if err := d.indexService(rk, rv); err != nil {
		return fmt.Errorf("upsert service: %w", err)
	}
	return nil
}

// DeleteService removes a service. Its Maglev table, counters and source
// ranges are keyed by ID and stay until removed separately.
func (d *Datapath) DeleteService(k ServiceKey) error {
	rk, err := k.raw()
	if err != nil {
		return fmt.Errorf("delete service: %w", err)
	}
	var old lbxdpLbService
	if err := d.objs.LbServices.Lookup(&rk, &old); err != nil {
		return fmt.Errorf("delete service: %w", err)
	}
	// The shortcut goes first: packets then find the service by lookup
	// until it is gone.
	if err := d.unindexService(old.Id, rk); err != nil {
		return fmt.Errorf("delete service: %w", err)
	}
	if err := d.delete(d.objs.LbServices, &rk); err != nil {
		return fmt.Errorf("delete service: %w", err)
	}
	if err := d.adjustVIP(rk, -1); err != nil {
		return fmt.Errorf("delete service: %w", err)
	}
	return nil
}

// adjustVIP keeps lb_vips in step with lb_services: the number of services per
// address and how many of them take all ports, per protocol; and
// lb_vip_filter in step with lb_vips.
func (d *Datapath) adjustVIP(k lbxdpLbServiceKey, delta int) error {
	vk := lbxdpLbVipKey{Addr: k.Addr, Family: k.Family}
	var v lbxdpLbVip
	existed := true
	if err := d.objs.LbVips.Lookup(&vk, &v); errors.Is(err, ebpf.ErrKeyNotExist) {
		existed = false
	} else if err != nil {
		return fmt.Errorf("look up vip: %w", err)
	}
	v.Services = uint32(int(v.Services) + delta)
	if k.Port == 0 {
		v.addWild(k.Proto, delta)
	}
	if v.Services == 0 {
		if err := d.delete(d.objs.LbVips, &vk); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("delete vip: %w", err)
		}
		// The filter bit goes after the address, never before.
		if existed {
			return d.filterVIP(vk, -1)
		}
		return nil
	}
	if !existed {
		if err := d.filterVIP(vk, 1); err != nil {
			return err
		}
	}
	if err := d.update(d.objs.LbVips, &vk, &v, ebpf.UpdateAny); err != nil {
		if !existed {
			_ = d.filterVIP(vk, -1)
		}
		return fmt.Errorf("update vip: %w", err)
	}
	return nil
}

// addWild counts an all-ports service of the protocol in or out.
func (v *lbxdpLbVip) addWild(proto uint8, delta int) {
	switch proto {
	case ProtoTCP:
		v.WildTcp = uint16(int(v.WildTcp) + delta)
	case ProtoUDP:
		v.WildUdp = uint16(int(v.WildUdp) + delta)
	default:
		v.WildSctp = uint16(int(v.WildSctp) + delta)
	}
}

// Services lists all services.
func (d *Datapath) Services() (map[ServiceKey]Service, error) {
	out := make(map[ServiceKey]Service)
	var k lbxdpLbServiceKey
	var v lbxdpLbService
	it := d.objs.LbServices.Iterate()
	for it.Next(&k, &v) {
		s := Service{ID: v.Id, DropNoBackend: v.Flags&svcDropNoBE != 0, SourceRanges: v.Flags&svcSrcRanges != 0}
		if v.Flags&svcHashSrc != 0 {
			s.HashMode = HashSourceAddr
		}
		if v.Flags&svcAffinity != 0 {
			s.AffinityTimeout = time.Duration(v.AffinityTimeout) * time.Second
		}
		if v.Flags&svcQUIC != 0 {
			s.QUIC = QUIC{ConfigID: v.QuicConfigId, ServerIDLen: v.QuicSidLen}
		}
		out[ServiceKey{VIP: bytesAddr(k.Addr, k.Family), Port: htons(k.Port), Proto: k.Proto}] = s
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("list services: %w", err)
	}
	return out, nil
}

func srcKey(serviceID uint32, p netip.Prefix) (lbxdpLbSrcKey, error) {
	if !p.IsValid() {
		return lbxdpLbSrcKey{}, fmt.Errorf("prefix %v: %w", p, ErrFamily)
	}
	p = p.Masked()
	addr, fam, err := addrBytes(p.Addr())
	if err != nil {
		return lbxdpLbSrcKey{}, err
	}
	return lbxdpLbSrcKey{Prefixlen: 64 + uint32(p.Bits()), ServiceId: serviceID, Family: fam, Addr: addr}, nil
}

// AddSourceRange allows clients in p to reach the service (enforced only when
// the service has SourceRanges set).
func (d *Datapath) AddSourceRange(serviceID uint32, p netip.Prefix) error {
	k, err := srcKey(serviceID, p)
	if err != nil {
		return fmt.Errorf("add source range: %w", err)
	}
	if err := d.update(d.objs.LbSrcRanges, &k, uint8(1), ebpf.UpdateAny); err != nil {
		return fmt.Errorf("add source range: %w", err)
	}
	return nil
}

// DeleteSourceRange removes an allowed prefix.
func (d *Datapath) DeleteSourceRange(serviceID uint32, p netip.Prefix) error {
	k, err := srcKey(serviceID, p)
	if err != nil {
		return fmt.Errorf("delete source range: %w", err)
	}
	if err := d.delete(d.objs.LbSrcRanges, &k); err != nil {
		return fmt.Errorf("delete source range: %w", err)
	}
	return nil
}

// SourceRanges lists the allowed prefixes of every service, by service ID.
func (d *Datapath) SourceRanges() (map[uint32][]netip.Prefix, error) {
	out := make(map[uint32][]netip.Prefix)
	var k lbxdpLbSrcKey
	var v uint8
	it := d.objs.LbSrcRanges.Iterate()
	for it.Next(&k, &v) {
		a := bytesAddr(k.Addr, k.Family)
		out[k.ServiceId] = append(out[k.ServiceId], netip.PrefixFrom(a, int(k.Prefixlen)-64))
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("list source ranges: %w", err)
	}
	return out, nil
}
