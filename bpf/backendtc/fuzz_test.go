//go:build linux

package backendtc

import (
	"encoding/binary"
	"errors"
	"net/netip"
	"testing"

	"github.com/lbd-dev/lbd/internal/pktgen"
	"golang.org/x/sys/unix"
)

// refEntry is the NAT entry a frame must produce according to the reference parser.
type refEntry struct {
	key NATKey
	vip netip.AddrPort
}

// refIngress is a reference reading of DESIGN.md §2, written apart from the C code: it
// returns the NAT entry that a frame entitles, or false when the frame is not
// well-formed lbd Geneve from an allowed source (or carries no ports).
func refIngress(frame []byte, allowed []netip.Prefix, vni uint32) (refEntry, bool) {
	var none refEntry
	if len(frame) < 14 {
		return none, false
	}
	var (
		src    netip.Addr
		udpOff int
		udpLen int
	)
	switch binary.BigEndian.Uint16(frame[12:14]) {
	case 0x0800:
		ip := frame[14:]
		if len(ip) < 20 || ip[0]>>4 != 4 || ip[0]&0x0f < 5 || ip[9] != 17 {
			return none, false
		}
		hl := int(ip[0]&0x0f) * 4
		if binary.BigEndian.Uint16(ip[6:8])&0x3fff != 0 { // any fragment
			return none, false
		}
		tot := int(binary.BigEndian.Uint16(ip[2:4]))
		if tot < hl+8 || tot > len(ip) {
			return none, false
		}
		src = netip.AddrFrom4([4]byte(ip[12:16]))
		udpOff, udpLen = 14+hl, tot-hl
	case 0x86dd:
		ip := frame[14:]
		if len(ip) < 40 || ip[0]>>4 != 6 || ip[6] != 17 {
			return none, false
		}
		plen := int(binary.BigEndian.Uint16(ip[4:6]))
		if plen < 8 || 40+plen > len(ip) {
			return none, false
		}
		src = netip.AddrFrom16([16]byte(ip[8:24]))
		udpOff, udpLen = 14+40, plen
	default:
		return none, false
	}
	udp := frame[udpOff:]
	if binary.BigEndian.Uint16(udp[2:4]) != 6081 || int(binary.BigEndian.Uint16(udp[4:6])) != udpLen {
		return none, false
	}
	ok := false
	for _, p := range allowed {
		ok = ok || p.Contains(src)
	}
	if !ok || udpLen < 16 {
		return none, false
	}
	gen := udp[8:udpLen]
	if gen[0]>>6 != 0 || gen[1]&0x80 != 0 || binary.BigEndian.Uint16(gen[2:4]) != 0x6558 ||
		uint32(gen[4])<<16|uint32(gen[5])<<8|uint32(gen[6]) != vni {
		return none, false
	}
	optLen := int(gen[0]&0x3f) * 4
	if len(gen) < 8+optLen+14 {
		return none, false
	}

	// Options: at most 8, our option exactly once, no unknown critical one.
	var vip netip.AddrPort
	opts := gen[8 : 8+optLen]
	found := false
	for n := 0; len(opts) > 0; n++ {
		if n == 8 || len(opts) < 4 {
			return none, false
		}
		class, typ, dlen := binary.BigEndian.Uint16(opts[0:2]), opts[2], int(opts[3]&0x1f)*4
		if len(opts) < 4+dlen {
			return none, false
		}
		data := opts[4 : 4+dlen]
		switch {
		case class == 0x014B && typ == 0x81:
			if found {
				return none, false
			}
			var addr netip.Addr
			switch dlen {
			case 8:
				addr = netip.AddrFrom4([4]byte(data[0:4]))
			case 20:
				addr = netip.AddrFrom16([16]byte(data[0:16]))
			default:
				return none, false
			}
			if data[dlen-2] != 0 || data[dlen-1] != 0 {
				return none, false
			}
			vip = netip.AddrPortFrom(addr, binary.BigEndian.Uint16(data[dlen-4:dlen-2]))
			found = true
		case typ&0x80 != 0:
			return none, false
		}
		opts = opts[4+dlen:]
	}
	if !found {
		return none, false
	}

	inner := gen[8+optLen+14:]
	var key NATKey
	var l4 []byte
	var proto byte
	switch et := binary.BigEndian.Uint16(gen[8+optLen+12:]); {
	case vip.Addr().Is4() && et == 0x0800:
		if len(inner) < 20 || inner[0]>>4 != 4 || inner[0]&0x0f < 5 {
			return none, false
		}
		hl := int(inner[0]&0x0f) * 4
		tot := int(binary.BigEndian.Uint16(inner[2:4]))
		if tot < hl || tot > len(inner) || binary.BigEndian.Uint16(inner[6:8])&0x1fff != 0 {
			return none, false
		}
		key.Client = netip.AddrPortFrom(netip.AddrFrom4([4]byte(inner[12:16])), 0)
		key.Backend = netip.AddrPortFrom(netip.AddrFrom4([4]byte(inner[16:20])), 0)
		proto, l4 = inner[9], inner[hl:tot]
	case vip.Addr().Is6() && et == 0x86dd:
		if len(inner) < 40 || inner[0]>>4 != 6 {
			return none, false
		}
		plen := int(binary.BigEndian.Uint16(inner[4:6]))
		if 40+plen > len(inner) {
			return none, false
		}
		key.Client = netip.AddrPortFrom(netip.AddrFrom16([16]byte(inner[8:24])), 0)
		key.Backend = netip.AddrPortFrom(netip.AddrFrom16([16]byte(inner[24:40])), 0)
		proto, l4 = inner[6], inner[40:40+plen]
	default:
		return none, false
	}
	switch {
	case proto == 6 && len(l4) >= 20, proto == 17 && len(l4) >= 8:
	default:
		return none, false
	}
	key.Proto = Proto(proto)
	key.Client = netip.AddrPortFrom(key.Client.Addr(), binary.BigEndian.Uint16(l4[0:2]))
	key.Backend = netip.AddrPortFrom(key.Backend.Addr(), binary.BigEndian.Uint16(l4[2:4]))
	if vip.Port() == 0 {
		vip = netip.AddrPortFrom(vip.Addr(), key.Backend.Port())
	}
	return refEntry{key: key, vip: vip}, true
}

// FuzzIngressNAT asserts that the ingress program creates a NAT entry exactly when
// the reference parser says the frame is well-formed Geneve from an allowed source,
// and that the entry is the one the frame describes.
func FuzzIngressNAT(f *testing.F) {
	for _, tc := range ingressCases() {
		f.Add(tc.In)
	}
	f.Add(v4Encap(pktgen.DSROption(vipV4)).Frame(udpReq.request())[:60])
	f.Add(v6Encap(pktgen.DSROption(vipV4)).Frame(tcpSyn.request()))

	d := newDatapath(f)
	allowed := []netip.Prefix{allowedV4, allowedV6}
	f.Fuzz(func(t *testing.T, frame []byte) {
		if _, _, err := (pktgen.Prog{Program: d.IngressProgram()}).Try(frame); errors.Is(err, unix.EINVAL) {
			// BPF_PROG_TEST_RUN refuses some frames (shorter than an Ethernet
			// header, an IPv4 EtherType without a full IPv4 header, larger than a
			// page) before the program runs.
			t.Skipf("kernel refuses test frame: %v", err)
		} else if err != nil {
			t.Fatal(err)
		}
		entries, err := d.NATEntries()
		if err != nil {
			t.Fatal(err)
		}
		keys := make([]NATKey, 0, len(entries))
		for _, e := range entries {
			keys = append(keys, e.NATKey)
		}
		if _, err := d.DeleteNAT(keys); err != nil {
			t.Fatal(err)
		}

		want, ok := refIngress(frame, allowed, DefaultConfig().VNI)
		switch {
		case !ok && len(entries) != 0:
			t.Fatalf("frame %x made NAT entries %+v but is not well-formed Geneve from an allowed source",
				frame, entries)
		case ok && len(entries) != 1:
			t.Fatalf("frame %x made %d NAT entries, want %+v", frame, len(entries), want)
		case ok && (entries[0].NATKey != want.key || entries[0].VIP != want.vip):
			t.Fatalf("frame %x made NAT entry %+v, want %+v", frame, entries[0], want)
		}
	})
}
