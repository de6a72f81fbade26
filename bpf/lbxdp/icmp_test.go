//go:build linux

package lbxdp

import (
	"encoding/binary"
	"net/netip"
	"testing"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
)

var router4 = netip.MustParseAddr("198.18.0.2")
var router6 = netip.MustParseAddr("2001:db8::2")

// icmpError builds an ICMP error from a router to the VIP about a reply the
// VIP sent (VIP:vport -> client:cport), quoting quote bytes of it.
func icmpError(tb testing.TB, vip, client netip.Addr, vport, cport uint16, typ, code uint8, info uint32, quote int) []byte {
	tb.Helper()
	var emb []byte
	if vip.Is4() {
		ip := &layers.IPv4{Version: 4, TTL: 1, Protocol: layers.IPProtocolTCP, SrcIP: vip.AsSlice(), DstIP: client.AsSlice(), Flags: layers.IPv4DontFragment}
		tcp := &layers.TCP{SrcPort: layers.TCPPort(vport), DstPort: layers.TCPPort(cport), Seq: 7, ACK: true, Window: 100}
		_ = tcp.SetNetworkLayerForChecksum(ip)
		emb = serialize(tb, ip, tcp, gopacket.Payload(make([]byte, 1000)))
		r := &layers.IPv4{Version: 4, TTL: 64, Protocol: layers.IPProtocolICMPv4, SrcIP: router4.AsSlice(), DstIP: vip.AsSlice()}
		icmp := &layers.ICMPv4{TypeCode: layers.CreateICMPv4TypeCode(typ, code), Id: uint16(info >> 16), Seq: uint16(info)}
		return serialize(tb, &layers.Ethernet{SrcMAC: clientMAC, DstMAC: nhMAC, EthernetType: layers.EthernetTypeIPv4}, r, icmp, gopacket.Payload(emb[:quote]))
	}
	ip := &layers.IPv6{Version: 6, HopLimit: 1, NextHeader: layers.IPProtocolTCP, SrcIP: vip.AsSlice(), DstIP: client.AsSlice()}
	tcp := &layers.TCP{SrcPort: layers.TCPPort(vport), DstPort: layers.TCPPort(cport), Seq: 7, ACK: true, Window: 100}
	_ = tcp.SetNetworkLayerForChecksum(ip)
	emb = serialize(tb, ip, tcp, gopacket.Payload(make([]byte, 1000)))
	r := &layers.IPv6{Version: 6, HopLimit: 64, NextHeader: layers.IPProtocolICMPv6, SrcIP: router6.AsSlice(), DstIP: vip.AsSlice()}
	icmp := &layers.ICMPv6{TypeCode: layers.CreateICMPv6TypeCode(typ, code)}
	_ = icmp.SetNetworkLayerForChecksum(r)
	body := binary.BigEndian.AppendUint32(nil, info)
	return serialize(tb, &layers.Ethernet{SrcMAC: clientMAC, DstMAC: nhMAC, EthernetType: layers.EthernetTypeIPv6}, r, icmp, gopacket.Payload(append(body, emb[:quote]...)))
}

// TestICMPErrorForwarding: ICMP errors about a VIP flow reach that flow's
// backend, translated so the backend recognises its own packet.
func TestICMPErrorForwarding(t *testing.T) {
	e := ctEnv(t)
	e.addService(t, svcSetup{ServiceKey{vip4, 90, ProtoTCP}, Service{ID: 10}, nil})
	// Flows known to conntrack, then the tables move to B: errors must follow
	// conntrack, not the table.
	e.sendTo(t, pkt{src: client4, dst: vip4, sport: 40000, dport: 80})
	e.sendTo(t, pkt{src: client6, dst: vip6, sport: 40000, dport: 80})
	e.setTable(t, 1, []uint32{2}, 31)
	e.setTable(t, 3, []uint32{4}, 31)

	fwd := []struct {
		name    string
		frame   []byte
		vip     netip.Addr
		client  netip.Addr
		backend netip.Addr
	}{
		{"frag needed, flow in conntrack", icmpError(t, vip4, client4, 80, 40000, 3, 4, 1280, 548), vip4, client4, beA},
		{"time exceeded, unknown flow uses the table", icmpError(t, vip4, client4, 80, 40001, 11, 0, 0, 28), vip4, client4, beB},
		{"port unreachable quoting ip options-free header+8", icmpError(t, vip4, client4, 80, 40002, 3, 3, 0, 28), vip4, client4, beB},
		{"packet too big, flow in conntrack", icmpError(t, vip6, client6, 80, 40000, 2, 0, 1280, 1000), vip6, client6, be6A},
		{"ipv6 unreachable, unknown flow", icmpError(t, vip6, client6, 80, 40009, 1, 4, 0, 48), vip6, client6, be6B},
	}
	for _, c := range fwd {
		t.Run(c.name, func(t *testing.T) {
			v, out := e.run(t, c.frame)
			if v != XDPTx {
				t.Fatalf("verdict %v, want XDP_TX", v)
			}
			d := decodeEncap(t, out)
			in := d.innerL3
			// Geneve option carries the VIP and service port.
			opt := d.geneve.Options[0].Data
			if addrFromBytes(opt[:len(c.vip.AsSlice())]) != c.vip || binary.BigEndian.Uint16(opt[len(c.vip.AsSlice()):]) != 80 {
				t.Errorf("DSR option % x", opt)
			}
			var icmp, emb []byte
			var embSrc, embDst netip.Addr
			if c.vip.Is4() {
				if addrFromBytes(in[12:16]) != router4 || addrFromBytes(in[16:20]) != c.backend || !ipv4HeaderOK(in[:20]) {
					t.Errorf("outer ICMP packet %v -> %v", addrFromBytes(in[12:16]), addrFromBytes(in[16:20]))
				}
				icmp = in[20:]
				if fold(onesSum(icmp)) != 0xffff {
					t.Error("ICMP checksum does not verify after translation")
				}
				emb = icmp[8:]
				if !ipv4HeaderOK(emb[:20]) {
					t.Error("embedded IPv4 checksum does not verify")
				}
				embSrc, embDst = addrFromBytes(emb[12:16]), addrFromBytes(emb[16:20])
				emb = emb[20:]
			} else {
				if addrFromBytes(in[8:24]) != router6 || addrFromBytes(in[24:40]) != c.backend {
					t.Errorf("outer ICMPv6 packet %v -> %v", addrFromBytes(in[8:24]), addrFromBytes(in[24:40]))
				}
				icmp = in[40:]
				if !l4SumOK(router6, c.backend, 58, icmp) {
					t.Error("ICMPv6 checksum does not verify after translation")
				}
				emb = icmp[8:]
				embSrc, embDst = addrFromBytes(emb[8:24]), addrFromBytes(emb[24:40])
				emb = emb[40:]
			}
			if embSrc != c.backend || embDst != c.client {
				t.Errorf("embedded packet %v -> %v, want %v -> %v", embSrc, embDst, c.backend, c.client)
			}
			if binary.BigEndian.Uint16(emb) != 8080 {
				t.Errorf("embedded source port %d, want the backend's 8080", binary.BigEndian.Uint16(emb))
			}
		})
	}

	t.Run("error about a port without service passes", func(t *testing.T) {
		if v, _ := e.run(t, icmpError(t, vip4, client4, 9999, 1, 3, 4, 1280, 28)); v != XDPPass {
			t.Errorf("verdict %v", v)
		}
	})
	t.Run("embedded source is not the vip", func(t *testing.T) {
		frame := icmpError(t, vip4, client4, 80, 1, 3, 4, 1280, 28)
		copy(frame[14+20+8+12:], vip4b.AsSlice())
		if v, _ := e.run(t, frame); v != XDPPass {
			t.Errorf("verdict %v", v)
		}
	})
	t.Run("truncated embedded header", func(t *testing.T) {
		e.expectDrop(t, icmpError(t, vip4, client4, 80, 1, 3, 4, 1280, 12), DropMalformed)
	})
	t.Run("service without backend", func(t *testing.T) {
		e.expectDrop(t, icmpError(t, vip4, client4, 90, 1, 3, 4, 1280, 28), DropNoBackend)
	})
}
