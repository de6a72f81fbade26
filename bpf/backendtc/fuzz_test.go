//go:build linux

package backendtc

import (
	"bytes"
	"encoding/binary"
	"errors"
	"net/netip"
	"slices"
	"testing"

	"github.com/lbd-dev/lbd/internal/pktgen"
	"golang.org/x/sys/unix"
)

// refEntry is the NAT entry a frame must produce according to the reference parser.
type refEntry struct {
	key NATKey
	vip netip.AddrPort
}

// refOutcome is what the reference parser says the program must do with a frame.
type refOutcome int

const (
	refPass  refOutcome = iota // not lbd's Geneve: on to the kernel, unchanged
	refDrop                    // lbd's (or claiming to be) but not acceptable
	refDecap                   // lbd's: stripped to the inner packet
)

func (o refOutcome) String() string { return [...]string{"pass", "drop", "decap"}[o] }

// refResult is the reference parser's reading of a frame: the outcome; for a
// decapsulated frame where its inner EtherType starts, and the NAT entry it makes
// (nil when the inner packet has no ports).
type refResult struct {
	outcome refOutcome
	inner   int
	entry   *refEntry
}

// refIngress is a reference reading of docs/wire-format.md and of which Geneve is lbd's,
// written apart from the C code. A frame is lbd's when it is UDP to port 6081 (not a
// fragment) whose lengths agree, with a Geneve version 0 header of the configured VNI
// whose options (walked up to 8) include lbd's DSR option; anything else passes. An
// lbd frame is decapsulated when it comes from an allowed source, its Geneve header
// is not a control packet and carries Ethernet, the option area is sound, the DSR
// option well-formed and alone of its kind, no other option critical, and the inner
// packet fits; otherwise it is dropped.
func refIngress(frame []byte, allowed []netip.Prefix, vni uint32) refResult {
	pass, drop := refResult{outcome: refPass}, refResult{outcome: refDrop}
	if len(frame) < 14 {
		return pass
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
			return pass
		}
		hl := int(ip[0]&0x0f) * 4
		if binary.BigEndian.Uint16(ip[6:8])&0x3fff != 0 { // any fragment
			return pass
		}
		tot := int(binary.BigEndian.Uint16(ip[2:4]))
		if tot < hl+8 || tot > len(ip) {
			return pass
		}
		src = netip.AddrFrom4([4]byte(ip[12:16]))
		udpOff, udpLen = 14+hl, tot-hl
	case 0x86dd:
		ip := frame[14:]
		if len(ip) < 40 || ip[0]>>4 != 6 || ip[6] != 17 {
			return pass
		}
		plen := int(binary.BigEndian.Uint16(ip[4:6]))
		if plen < 8 || 40+plen > len(ip) {
			return pass
		}
		src = netip.AddrFrom16([16]byte(ip[8:24]))
		udpOff, udpLen = 14+40, plen
	default:
		return pass
	}
	udp := frame[udpOff:]
	if binary.BigEndian.Uint16(udp[2:4]) != 6081 || int(binary.BigEndian.Uint16(udp[4:6])) != udpLen || udpLen < 16 {
		return pass
	}
	gen := udp[8:udpLen]
	if gen[0]>>6 != 0 || uint32(gen[4])<<16|uint32(gen[5])<<8|uint32(gen[6]) != vni {
		return pass
	}
	optLen := int(gen[0]&0x3f) * 4
	if len(gen) < 8+optLen {
		return pass
	}

	// Options: lbd's frame when the DSR option is among the first 8.
	var vip netip.AddrPort
	opts := gen[8 : 8+optLen]
	found, critical, broken := false, false, false
walk:
	for n := 0; len(opts) > 0; n++ {
		if n == 8 || len(opts) < 4 {
			broken = true
			break
		}
		class, typ, dlen := binary.BigEndian.Uint16(opts[0:2]), opts[2], int(opts[3]&0x1f)*4
		ours := class == 0x014B && typ == 0x81
		switch {
		case ours && (found || len(opts) < 4+dlen):
			return drop
		case ours:
			data := opts[4 : 4+dlen]
			var addr netip.Addr
			switch dlen {
			case 8:
				addr = netip.AddrFrom4([4]byte(data[0:4]))
			case 20:
				addr = netip.AddrFrom16([16]byte(data[0:16]))
			default:
				return drop
			}
			if data[dlen-2] != 0 || data[dlen-1] != 0 {
				return drop
			}
			vip = netip.AddrPortFrom(addr, binary.BigEndian.Uint16(data[dlen-4:dlen-2]))
			found = true
		case len(opts) < 4+dlen:
			broken = true
			break walk
		case typ&0x80 != 0:
			critical = true
		}
		opts = opts[4+dlen:]
	}
	if !found {
		return pass
	}

	// lbd's, or claiming to be: decapsulated or dropped.
	ok := false
	for _, p := range allowed {
		ok = ok || p.Contains(src)
	}
	if !ok || gen[1]&0x80 != 0 || binary.BigEndian.Uint16(gen[2:4]) != 0x6558 || broken || critical ||
		len(gen) < 8+optLen+14 {
		return drop
	}
	inner := gen[8+optLen+14:]
	decap := refResult{outcome: refDecap, inner: udpOff + 8 + 8 + optLen + 12}
	var key NATKey
	var l4 []byte
	var proto byte
	switch et := binary.BigEndian.Uint16(gen[8+optLen+12:]); {
	case vip.Addr().Is4() && et == 0x0800:
		if len(inner) < 20 || inner[0]>>4 != 4 || inner[0]&0x0f < 5 {
			return drop
		}
		hl := int(inner[0]&0x0f) * 4
		tot := int(binary.BigEndian.Uint16(inner[2:4]))
		if tot < hl || tot > len(inner) {
			return drop
		}
		if binary.BigEndian.Uint16(inner[6:8])&0x1fff != 0 { // a later fragment: no ports
			return decap
		}
		key.Client = netip.AddrPortFrom(netip.AddrFrom4([4]byte(inner[12:16])), 0)
		key.Backend = netip.AddrPortFrom(netip.AddrFrom4([4]byte(inner[16:20])), 0)
		proto, l4 = inner[9], inner[hl:tot]
	case vip.Addr().Is6() && et == 0x86dd:
		if len(inner) < 40 || inner[0]>>4 != 6 {
			return drop
		}
		plen := int(binary.BigEndian.Uint16(inner[4:6]))
		if 40+plen > len(inner) {
			return drop
		}
		key.Client = netip.AddrPortFrom(netip.AddrFrom16([16]byte(inner[8:24])), 0)
		key.Backend = netip.AddrPortFrom(netip.AddrFrom16([16]byte(inner[24:40])), 0)
		proto, l4 = inner[6], inner[40:40+plen]
	default:
		return drop
	}
	switch {
	case proto == 6 && len(l4) >= 20, proto == 17 && len(l4) >= 8, proto == 132 && len(l4) >= 16:
	case proto == 6, proto == 17, proto == 132: // SCTP: the common header and a chunk's header
		return drop
	default:
		return decap // no ports: no entry
	}
	key.Proto = Proto(proto)
	key.Client = netip.AddrPortFrom(key.Client.Addr(), binary.BigEndian.Uint16(l4[0:2]))
	key.Backend = netip.AddrPortFrom(key.Backend.Addr(), binary.BigEndian.Uint16(l4[2:4]))
	if vip.Port() == 0 {
		vip = netip.AddrPortFrom(vip.Addr(), key.Backend.Port())
	}
	decap.entry = &refEntry{key: key, vip: vip}
	return decap
}

// FuzzIngressNAT asserts that the ingress program does with every frame what the
// reference parser says: passes a frame that is not lbd's on byte for byte, drops an
// lbd frame that is not acceptable, and decapsulates the others, creating exactly the
// NAT entry the frame describes.
func FuzzIngressNAT(f *testing.F) {
	for _, tc := range ingressCases() {
		f.Add(tc.In)
	}
	f.Add(v4Encap(pktgen.DSROption(vipV4)).Frame(udpReq.request())[:60])
	f.Add(v6Encap(pktgen.DSROption(vipV4)).Frame(tcpSyn.request()))

	d := newDatapath(f)
	allowed := []netip.Prefix{allowedV4, allowedV6}
	f.Fuzz(func(t *testing.T, frame []byte) {
		verdict, out, err := (pktgen.Prog{Program: d.IngressProgram()}).Try(frame)
		if errors.Is(err, unix.EINVAL) {
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

		want := refIngress(frame, allowed, DefaultConfig().VNI)
		wantVerdict := uint32(verdictNext)
		if want.outcome == refDrop {
			wantVerdict = verdictDrop
		}
		if verdict != wantVerdict {
			t.Fatalf("frame %x: verdict %#x, want %#x (%v)", frame, verdict, wantVerdict, want.outcome)
		}
		switch want.outcome {
		case refPass:
			if !bytes.Equal(out, frame) {
				t.Fatalf("frame %x is not lbd's but came out changed:\n%s", frame, pktgen.Diff(frame, out))
			}
		case refDecap:
			// The outer Ethernet addresses, then the inner EtherType and all behind.
			if w := append(slices.Clone(frame[:12]), frame[want.inner:]...); !bytes.Equal(out, w) {
				t.Fatalf("frame %x decapsulated wrongly:\n%s", frame, pktgen.Diff(w, out))
			}
		}
		switch {
		case want.entry == nil && len(entries) != 0:
			t.Fatalf("frame %x (%v) made NAT entries %+v, want none", frame, want.outcome, entries)
		case want.entry != nil && len(entries) != 1:
			t.Fatalf("frame %x made %d NAT entries, want %+v", frame, len(entries), *want.entry)
		case want.entry != nil && (entries[0].NATKey != want.entry.key || entries[0].VIP != want.entry.vip):
			t.Fatalf("frame %x made NAT entry %+v, want %+v", frame, entries[0], *want.entry)
		}
	})
}
