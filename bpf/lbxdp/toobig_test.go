//go:build linux

package lbxdp

import (
	"bytes"
	"encoding/binary"
	"net"
	"testing"
)

// checkICMPReply verifies an ICMP/ICMPv6 error built by the program: sent back
// to the client from the VIP on the link it came from (VLAN tag kept), the
// type-specific word, the quote of the original packet, and checksums
// recomputed here.
func checkICMPReply(t *testing.T, p pkt, in, out []byte, typ, code uint8, info uint32) {
	t.Helper()
	l3 := 14
	if p.vlan != 0 {
		l3 = 18
		if !bytes.Equal(out[12:18], in[12:18]) {
			t.Errorf("VLAN tag % x, want % x", out[12:18], in[12:18])
		}
	}
	if !bytes.Equal(out[0:6], in[6:12]) || !bytes.Equal(out[6:12], in[0:6]) {
		t.Errorf("reply MACs %v -> %v, want swapped", net.HardwareAddr(out[6:12]), net.HardwareAddr(out[0:6]))
	}
	origIP := in[l3 : l3+ipLen(in[l3:])]
	quote := origIP[:min(len(origIP), 128)]
	ipb := out[l3:]
	var icmp []byte
	if p.src.Is4() {
		if !bytes.Equal(out[l3-2:l3], []byte{0x08, 0x00}) || ipb[0] != 0x45 || ipb[9] != 1 || ipb[8] != 64 {
			t.Errorf("reply IPv4 header % x", ipb[:20])
		}
		if int(binary.BigEndian.Uint16(ipb[2:])) != len(ipb) || !ipv4HeaderOK(ipb[:20]) {
			t.Errorf("reply IPv4 length %d of %d or checksum bad", binary.BigEndian.Uint16(ipb[2:]), len(ipb))
		}
		if addrFromBytes(ipb[12:16]) != p.dst || addrFromBytes(ipb[16:20]) != p.src {
			t.Errorf("reply %v -> %v, want %v -> %v", addrFromBytes(ipb[12:16]), addrFromBytes(ipb[16:20]), p.dst, p.src)
		}
		icmp = ipb[20:]
		if fold(onesSum(icmp)) != 0xffff {
			t.Error("ICMP checksum does not verify")
		}
	} else {
		if !bytes.Equal(out[l3-2:l3], []byte{0x86, 0xdd}) || ipb[0]>>4 != 6 || ipb[6] != 58 || ipb[7] != 64 {
			t.Errorf("reply IPv6 header % x", ipb[:40])
		}
		if int(binary.BigEndian.Uint16(ipb[4:]))+40 != len(ipb) {
			t.Errorf("reply IPv6 payload length %d of %d", binary.BigEndian.Uint16(ipb[4:]), len(ipb))
		}
		if addrFromBytes(ipb[8:24]) != p.dst || addrFromBytes(ipb[24:40]) != p.src {
			t.Errorf("reply %v -> %v", addrFromBytes(ipb[8:24]), addrFromBytes(ipb[24:40]))
		}
		icmp = ipb[40:]
		if !l4SumOK(p.dst, p.src, 58, icmp) {
			t.Error("ICMPv6 checksum does not verify")
		}
	}
	if icmp[0] != typ || icmp[1] != code || binary.BigEndian.Uint32(icmp[4:]) != info {
		t.Errorf("ICMP type %d code %d info %d, want %d %d %d", icmp[0], icmp[1], binary.BigEndian.Uint32(icmp[4:]), typ, code, info)
	}
	if !bytes.Equal(icmp[8:], quote) {
		t.Errorf("quoted %d bytes, want the first %d bytes of the original packet", len(icmp[8:]), len(quote))
	}
}

// TestTooBig: a packet that would not fit the egress MTU once encapsulated is
// answered with ICMP "fragmentation needed" (IPv4 + DF) or ICMPv6 "packet too
// big" carrying egress MTU minus overhead; a packet that fits exactly goes
// through.
func TestTooBig(t *testing.T) {
	e := newEnv(t)
	e.addBackend(t, 1, "198.18.20.1", 8080, "198.18.12.1")       // IPv4 node, route MTU 1400
	e.addBackend(t, 2, "2001:db8:20::2", 8080, "2001:db8:12::2") // IPv6 node, route MTU 1400
	e.addBackend(t, 3, "2001:db8:20::3", 8080, "198.18.12.3")
	e.addBackend(t, 4, "198.18.20.4", 8080, "198.18.10.4") // device MTU 1500
	e.addBackend(t, 5, "198.18.20.5", 8080, "2001:db8:12::5")
	e.addService(t, svcSetup{ServiceKey{vip4, 80, ProtoTCP}, Service{ID: 1}, []uint32{1}})
	e.addService(t, svcSetup{ServiceKey{vip6, 80, ProtoTCP}, Service{ID: 2}, []uint32{2}})
	e.addService(t, svcSetup{ServiceKey{vip6, 81, ProtoTCP}, Service{ID: 3}, []uint32{3}})
	e.addService(t, svcSetup{ServiceKey{vip4, 81, ProtoUDP}, Service{ID: 4}, []uint32{4}})
	e.addService(t, svcSetup{ServiceKey{vip4, 82, ProtoTCP}, Service{ID: 5}, []uint32{5}})

	// Payload giving an IP packet of n bytes.
	tcp4 := func(n int) int { return n - 40 }
	cases := []struct {
		name    string
		p       pkt
		typ     uint8
		code    uint8
		mtu     uint32
		forward bool
	}{
		{"ipv4 df over ipv4, one byte too many", pkt{src: client4, dst: vip4, sport: 1, dport: 80, df: true, payload: tcp4(1400 - 62 + 1)}, 3, 4, 1338, false},
		{"ipv4 df over ipv4, exact fit", pkt{src: client4, dst: vip4, sport: 2, dport: 80, df: true, payload: tcp4(1400 - 62)}, 0, 0, 0, true},
		{"ipv4 df full size", pkt{src: client4, dst: vip4, sport: 3, dport: 80, df: true, payload: 1400}, 3, 4, 1338, false},
		{"ipv4 df vlan tagged", pkt{src: client4, dst: vip4, sport: 4, dport: 80, df: true, payload: 1400, vlan: 9}, 3, 4, 1338, false},
		{"udp4 df at device mtu 1500", pkt{src: client4, dst: vip4, sport: 5, dport: 81, proto: ProtoUDP, df: true, payload: 1472}, 3, 4, 1438, false},
		{"ipv4 df over ipv6 underlay", pkt{src: client4, dst: vip4, sport: 6, dport: 82, df: true, payload: 1400}, 3, 4, 1400 - 82, false},
		{"ipv6 over ipv6", pkt{src: client6, dst: vip6, sport: 7, dport: 80, payload: 1400}, 2, 0, 1400 - 94, false},
		{"ipv6 over ipv6, exact fit", pkt{src: client6, dst: vip6, sport: 8, dport: 80, payload: 1400 - 94 - 60}, 0, 0, 0, true},
		{"ipv6 over ipv4", pkt{src: client6, dst: vip6, sport: 9, dport: 81, payload: 1400}, 2, 0, 1400 - 74, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			in := c.p.build(t)
			before := e.drops(t)[DropTooBig].Packets
			v, out := e.run(t, in)
			if c.forward {
				if v != XDPTx {
					t.Fatalf("verdict %v, want XDP_TX", v)
				}
				return
			}
			if v != XDPTx {
				t.Fatalf("verdict %v, want XDP_TX of an ICMP error", v)
			}
			checkICMPReply(t, c.p, in, out, c.typ, c.code, c.mtu)
			if after := e.drops(t)[DropTooBig].Packets; after != before+1 {
				t.Errorf("too-big counter %d -> %d", before, after)
			}
		})
	}
	t.Run("ipv4 without df is dropped and counted", func(t *testing.T) {
		e.expectDrop(t, pkt{src: client4, dst: vip4, sport: 10, dport: 80, payload: 1400}.build(t), DropTooBigUnsignaled)
	})
}
