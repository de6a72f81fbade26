//go:build linux

package lbxdp

import (
	"bytes"
	"encoding/binary"
	"testing"
)

// TestReject: new flows to a service without a usable backend are answered
// like Kubernetes does (TCP RST, ICMP/ICMPv6 port unreachable), or dropped
// when the service asks for it; both are counted.
func TestReject(t *testing.T) {
	e := newEnv(t)
	e.addService(t, svcSetup{ServiceKey{vip4, 80, ProtoTCP}, Service{ID: 1}, nil})
	e.addService(t, svcSetup{ServiceKey{vip4, 53, ProtoUDP}, Service{ID: 2}, nil})
	e.addService(t, svcSetup{ServiceKey{vip6, 80, ProtoTCP}, Service{ID: 3}, nil})
	e.addService(t, svcSetup{ServiceKey{vip6, 53, ProtoUDP}, Service{ID: 4}, nil})
	e.addService(t, svcSetup{ServiceKey{vip4, 81, ProtoTCP}, Service{ID: 5, DropNoBackend: true}, nil})
	// A table whose only backend was deleted rejects too.
	e.addService(t, svcSetup{ServiceKey{vip4, 82, ProtoTCP}, Service{ID: 6}, []uint32{42}})

	tcpCases := []struct {
		name     string
		p        pkt
		flags    uint8
		seq, ack uint32
	}{
		{"tcp4 syn", pkt{src: client4, dst: vip4, sport: 1111, dport: 80}, tcpRST | tcpACK, 0, 1001},
		{"tcp4 ack with data", pkt{src: client4, dst: vip4, sport: 1112, dport: 80, tcpFlags: tcpACK | tcpPSH, payload: 10}, tcpRST, 5000, 0},
		{"tcp4 fin without ack", pkt{src: client4, dst: vip4, sport: 1113, dport: 80, tcpFlags: tcpFIN, payload: 3}, tcpRST | tcpACK, 0, 1004},
		{"tcp4 syn with ip options", pkt{src: client4, dst: vip4, sport: 1114, dport: 80, ipOptions: true}, tcpRST | tcpACK, 0, 1001},
		{"tcp4 syn vlan", pkt{src: client4, dst: vip4, sport: 1115, dport: 80, vlan: 5}, tcpRST | tcpACK, 0, 1001},
		{"tcp4 dangling backend", pkt{src: client4, dst: vip4, sport: 1116, dport: 82}, tcpRST | tcpACK, 0, 1001},
		{"tcp6 syn", pkt{src: client6, dst: vip6, sport: 1117, dport: 80}, tcpRST | tcpACK, 0, 1001},
		{"tcp6 syn hop-by-hop", pkt{src: client6, dst: vip6, sport: 1118, dport: 80, extHdr: true, payload: 20}, tcpRST | tcpACK, 0, 1021},
	}
	for _, c := range tcpCases {
		t.Run(c.name, func(t *testing.T) {
			in := c.p.build(t)
			before := e.drops(t)[DropRejected].Packets
			v, out := e.run(t, in)
			if v != XDPTx {
				t.Fatalf("verdict %v, want XDP_TX of a RST", v)
			}
			checkRST(t, c.p, in, out, c.flags, c.seq, c.ack)
			if after := e.drops(t)[DropRejected].Packets; after != before+1 {
				t.Errorf("rejected counter %d -> %d", before, after)
			}
		})
	}
	udpCases := []struct {
		name string
		p    pkt
		typ  uint8
		code uint8
	}{
		{"udp4", pkt{src: client4, dst: vip4, sport: 2222, dport: 53, proto: ProtoUDP, payload: 30}, 3, 3},
		{"udp4 large quote capped", pkt{src: client4, dst: vip4, sport: 2223, dport: 53, proto: ProtoUDP, payload: 500}, 3, 3},
		{"udp6", pkt{src: client6, dst: vip6, sport: 2224, dport: 53, proto: ProtoUDP, payload: 30}, 1, 4},
		{"udp6 vlan", pkt{src: client6, dst: vip6, sport: 2225, dport: 53, proto: ProtoUDP, payload: 1, vlan: 12}, 1, 4},
	}
	for _, c := range udpCases {
		t.Run(c.name, func(t *testing.T) {
			in := c.p.build(t)
			v, out := e.run(t, in)
			if v != XDPTx {
				t.Fatalf("verdict %v, want XDP_TX of an ICMP error", v)
			}
			checkICMPReply(t, c.p, in, out, c.typ, c.code, 0)
		})
	}
	t.Run("rst is not answered", func(t *testing.T) {
		v, _ := e.run(t, pkt{src: client4, dst: vip4, sport: 3333, dport: 80, tcpFlags: tcpRST}.build(t))
		if v != XDPDrop {
			t.Fatalf("verdict %v, want XDP_DROP", v)
		}
	})
	t.Run("drop option", func(t *testing.T) {
		e.expectDrop(t, pkt{src: client4, dst: vip4, sport: 4444, dport: 81}.build(t), DropNoBackend)
	})
}

// checkRST verifies a TCP reset sent by the program, checksums recomputed.
func checkRST(t *testing.T, p pkt, in, out []byte, flags uint8, seq, ack uint32) {
	t.Helper()
	l3 := 14
	if p.vlan != 0 {
		l3 = 18
		if !bytes.Equal(out[12:18], in[12:18]) {
			t.Errorf("VLAN tag not kept")
		}
	}
	if !bytes.Equal(out[0:6], in[6:12]) || !bytes.Equal(out[6:12], in[0:6]) {
		t.Error("reply MACs not swapped")
	}
	ipb := out[l3:]
	var tcp []byte
	if p.src.Is4() {
		if len(ipb) != 40 || ipb[0] != 0x45 || ipb[9] != 6 || binary.BigEndian.Uint16(ipb[2:]) != 40 || !ipv4HeaderOK(ipb[:20]) {
			t.Fatalf("RST IPv4 header % x (len %d)", ipb[:20], len(ipb))
		}
		if addrFromBytes(ipb[12:16]) != p.dst || addrFromBytes(ipb[16:20]) != p.src {
			t.Errorf("RST addresses wrong")
		}
		tcp = ipb[20:]
	} else {
		if len(ipb) != 60 || ipb[6] != 6 || binary.BigEndian.Uint16(ipb[4:]) != 20 {
			t.Fatalf("RST IPv6 header % x (len %d)", ipb[:40], len(ipb))
		}
		if addrFromBytes(ipb[8:24]) != p.dst || addrFromBytes(ipb[24:40]) != p.src {
			t.Errorf("RST addresses wrong")
		}
		tcp = ipb[40:]
	}
	if binary.BigEndian.Uint16(tcp) != p.dport || binary.BigEndian.Uint16(tcp[2:]) != p.sport {
		t.Errorf("RST ports %d -> %d", binary.BigEndian.Uint16(tcp), binary.BigEndian.Uint16(tcp[2:]))
	}
	if tcp[13] != flags || binary.BigEndian.Uint32(tcp[4:]) != seq || binary.BigEndian.Uint32(tcp[8:]) != ack || tcp[12] != 0x50 {
		t.Errorf("RST flags %#x seq %d ack %d, want %#x %d %d", tcp[13], binary.BigEndian.Uint32(tcp[4:]), binary.BigEndian.Uint32(tcp[8:]), flags, seq, ack)
	}
	if !l4SumOK(p.dst, p.src, ProtoTCP, tcp) {
		t.Error("RST checksum does not verify")
	}
}
