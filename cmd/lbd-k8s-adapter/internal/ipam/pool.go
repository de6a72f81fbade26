// Package ipam allocates LoadBalancer VIPs from configured pools. It holds no state of its
// own: what is allocated is what Services' status says, so a new leader, a restart or a
// deleted Service (whose addresses simply stop being in use) need no bookkeeping.
package ipam

import (
	"fmt"
	"net/netip"
	"strings"
)

// Pool is a named set of address ranges.
type Pool struct {
	Name string
	// AutoAssign lets the pool serve Services that do not ask for a pool by name.
	AutoAssign bool
	ranges     []addrRange
}

// addrRange is an inclusive range of addresses of one family.
type addrRange struct{ first, last netip.Addr }

// NewPool parses CIDR prefixes ("203.0.113.0/28") and inclusive ranges
// ("203.0.113.10-203.0.113.20"); every address of them is allocatable (a VIP is a /32 or
// /128 on the LB, so the network and broadcast addresses of a prefix are not special).
func NewPool(name string, addrs []string, autoAssign bool) (*Pool, error) {
	if len(addrs) == 0 {
		return nil, fmt.Errorf("pool %q has no addresses", name)
	}
	p := &Pool{Name: name, AutoAssign: autoAssign}
	for _, s := range addrs {
		r, err := parseRange(strings.TrimSpace(s))
		if err != nil {
			return nil, fmt.Errorf("pool %q: %w", name, err)
		}
		for _, o := range p.ranges {
			if r.overlaps(o) {
				return nil, fmt.Errorf("pool %q: %q overlaps another range of the pool", name, s)
			}
		}
		p.ranges = append(p.ranges, r)
	}
	return p, nil
}

func parseRange(s string) (addrRange, error) {
	if first, last, ok := strings.Cut(s, "-"); ok {
		a, err1 := netip.ParseAddr(strings.TrimSpace(first))
		b, err2 := netip.ParseAddr(strings.TrimSpace(last))
		if err1 != nil || err2 != nil || a.Zone() != "" || b.Zone() != "" {
			return addrRange{}, fmt.Errorf("%q is not a range of two addresses", s)
		}
		a, b = a.Unmap(), b.Unmap()
		if a.Is4() != b.Is4() || b.Less(a) {
			return addrRange{}, fmt.Errorf("%q: the range must go up within one family", s)
		}
		return addrRange{a, b}, nil
	}
	p, err := netip.ParsePrefix(s)
	if err != nil {
		return addrRange{}, fmt.Errorf("%q is neither a CIDR prefix nor a range", s)
	}
	p = netip.PrefixFrom(p.Addr().Unmap(), p.Bits())
	if p.Bits() < 0 || p != p.Masked() {
		return addrRange{}, fmt.Errorf("%q has host bits set (did you mean %s?)", s, p.Masked())
	}
	return addrRange{p.Addr(), lastOf(p)}, nil
}

// lastOf returns the highest address of a masked prefix.
func lastOf(p netip.Prefix) netip.Addr {
	b := p.Addr().AsSlice()
	for i := p.Bits(); i < len(b)*8; i++ {
		b[i/8] |= 0x80 >> (i % 8)
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}

func (r addrRange) contains(a netip.Addr) bool {
	return a.Is4() == r.first.Is4() && r.first.Compare(a) <= 0 && a.Compare(r.last) <= 0
}

func (r addrRange) overlaps(o addrRange) bool {
	return r.first.Is4() == o.first.Is4() && r.first.Compare(o.last) <= 0 && o.first.Compare(r.last) <= 0
}

// Contains reports whether a is in the pool.
func (p *Pool) Contains(a netip.Addr) bool {
	a = a.Unmap()
	for _, r := range p.ranges {
		if r.contains(a) {
			return true
		}
	}
	return false
}

// Overlap returns an address that both pools contain, if any.
func (p *Pool) Overlap(o *Pool) (netip.Addr, bool) {
	for _, r := range p.ranges {
		for _, s := range o.ranges {
			if r.overlaps(s) {
				if r.first.Less(s.first) {
					return s.first, true
				}
				return r.first, true
			}
		}
	}
	return netip.Addr{}, false
}

// HasFamily reports whether the pool has addresses of the family of a (IPv4 or IPv6).
func (p *Pool) HasFamily(ipv4 bool) bool {
	for _, r := range p.ranges {
		if r.first.Is4() == ipv4 {
			return true
		}
	}
	return false
}

// firstFree returns the lowest address of the family that used does not hold. The walk
// skips only used addresses, so it costs at most one step per allocated address.
func (p *Pool) firstFree(ipv4 bool, used map[netip.Addr]string) (netip.Addr, bool) {
	for _, r := range p.ranges {
		if r.first.Is4() != ipv4 {
			continue
		}
		for a := r.first; a.IsValid() && a.Compare(r.last) <= 0; a = a.Next() {
			if _, taken := used[a]; !taken {
				return a, true
			}
		}
	}
	return netip.Addr{}, false
}
