//go:build linux

package backendtc

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/cilium/ebpf/link"
	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
	"github.com/lbd-dev/lbd/internal/pktgen"
	"github.com/lbd-dev/lbd/internal/testnet"
	"golang.org/x/sys/unix"
)

// topo is an LB-side namespace (where the test injects Geneve and captures replies)
// and a backend namespace running the TC programs, joined by a veth pair.
type topo struct {
	lbNS, beNS     *testnet.NS
	lbIf, beIf     string
	lbMAC, beMAC   net.HardwareAddr
	lbIdx, beIdx   int
	lbAddr, beAddr netip.Addr
	client         netip.Addr
}

func newTopo(t *testing.T, v6, txOff bool) *topo {
	t.Helper()
	sfx := testnet.Suffix(t)
	tp := &topo{lbNS: testnet.NewNS(t, "betc-lb-"+sfx), beNS: testnet.NewNS(t, "betc-be-"+sfx), lbIf: "btl" + sfx, beIf: "btb" + sfx}
	bits, route := 24, "198.19.200.0/24"
	tp.lbAddr, tp.beAddr = netip.MustParseAddr("198.18.200.1"), netip.MustParseAddr("198.18.200.2")
	tp.client = netip.MustParseAddr("198.19.200.7")
	if v6 {
		bits, route = 64, "2001:db8:c8::/64"
		tp.lbAddr, tp.beAddr = netip.MustParseAddr("2001:db8:c7::1"), netip.MustParseAddr("2001:db8:c7::2")
		tp.client = netip.MustParseAddr("2001:db8:c8::7")
	}

	testnet.Veth(t, testnet.VethEnd{NS: tp.lbNS, Name: tp.lbIf}, testnet.VethEnd{NS: tp.beNS, Name: tp.beIf})
	tp.lbNS.AddAddr(t, tp.lbIf, netip.PrefixFrom(tp.lbAddr, bits))
	tp.beNS.AddAddr(t, tp.beIf, netip.PrefixFrom(tp.beAddr, bits))
	tp.beNS.IP(t, "route add "+route+" via "+tp.lbAddr.String())
	// Off: the backend's stack writes full checksums, so the capture can verify
	// them. On: replies stay CHECKSUM_PARTIAL and the capture checks the seed.
	tx := "on"
	if txOff {
		tx = "off"
	}
	tp.beNS.Exec(t, "ethtool", "-K", tp.beIf, "tx", tx)

	lb, be := tp.lbNS.Interface(t, tp.lbIf), tp.beNS.Interface(t, tp.beIf)
	tp.lbMAC, tp.lbIdx, tp.beMAC, tp.beIdx = lb.HardwareAddr, lb.Index, be.HardwareAddr, be.Index
	return tp
}

// segment is a TCP segment as captured on the LB side.
type segment struct {
	ip  []byte
	tcp *layers.TCP
	src netip.AddrPort
	dst netip.AddrPort
}

// nextSegment returns the next TCP segment the backend node sends to client, or
// fails after the deadline.
func nextSegment(t *testing.T, fd int, client netip.AddrPort, deadline time.Time) segment {
	t.Helper()
	buf := make([]byte, 4096)
	for time.Now().Before(deadline) {
		n, from, err := unix.Recvfrom(fd, buf, 0)
		if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			t.Fatalf("capture: %v", err)
		}
		if ll, ok := from.(*unix.SockaddrLinklayer); ok && ll.Pkttype == unix.PACKET_OUTGOING {
			continue
		}
		pkt := gopacket.NewPacket(append([]byte(nil), buf[:n]...), layers.LayerTypeEthernet, gopacket.Default)
		tcp, ok := pkt.Layer(layers.LayerTypeTCP).(*layers.TCP)
		nl := pkt.NetworkLayer()
		if !ok || nl == nil {
			continue
		}
		src, _ := netip.AddrFromSlice(nl.NetworkFlow().Src().Raw())
		dst, _ := netip.AddrFromSlice(nl.NetworkFlow().Dst().Raw())
		s := segment{ip: pkt.Data()[14:], tcp: tcp,
			src: netip.AddrPortFrom(src, uint16(tcp.SrcPort)), dst: netip.AddrPortFrom(dst, uint16(tcp.DstPort))}
		if s.dst == client {
			return s
		}
	}
	t.Fatalf("no TCP segment to %v before the deadline", client)
	return segment{}
}

// TestNetnsTCPHandshake runs a real TCP server behind the TC programs: Geneve frames
// built as an LB node builds them are injected from a peer namespace, the handshake
// completes, and every reply captured on the LB side comes from VIP:port with valid
// checksums.
func TestNetnsTCPHandshake(t *testing.T) {
	testnet.Require(t, "ip", "ethtool")
	for _, tc := range []struct {
		name      string
		v6, txOff bool
		vip       netip.AddrPort
	}{
		{name: "IPv4 tx off", txOff: true, vip: netip.MustParseAddrPort("203.0.113.20:80")},
		{name: "IPv6 tx off", v6: true, txOff: true, vip: netip.MustParseAddrPort("[2001:db8:f::20]:80")},
		{name: "IPv4 tx on", vip: netip.MustParseAddrPort("203.0.113.20:80")},
	} {
		t.Run(tc.name, func(t *testing.T) { testHandshake(t, tc.v6, tc.txOff, tc.vip) })
	}
}

func testHandshake(t *testing.T, v6, txOff bool, vip netip.AddrPort) {
	tp := newTopo(t, v6, txOff)
	d := newDatapath(t)
	bits := 32
	if v6 {
		bits = 128
	}
	if err := d.AddAllowedSource(netip.PrefixFrom(tp.lbAddr, bits)); err != nil {
		t.Fatal(err)
	}
	err := tp.beNS.DoErr(func() error {
		for _, attach := range []func(int) (link.Link, error){d.AttachIngress, d.AttachEgress} {
			l, err := attach(tp.beIdx)
			if err != nil {
				return err
			}
			t.Cleanup(func() { l.Close() })
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}

	backend := netip.AddrPortFrom(tp.beAddr, 8080)
	var ln net.Listener
	if err := tp.beNS.DoErr(func() error {
		var err error
		ln, err = net.Listen("tcp", backend.String())
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	accepted := make(chan error, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			accepted <- err
			return
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(5 * time.Second))
		accepted <- nil
		buf := make([]byte, 64)
		n, err := c.Read(buf)
		if err != nil && !errors.Is(err, io.EOF) {
			return
		}
		c.Write(append([]byte("pong:"), buf[:n]...))
	}()

	// It injects the frames an LB node would send and sees every frame the backend
	// node sends back.
	fd := tp.lbNS.PacketSocket(t, tp.lbIf)
	client := netip.AddrPortFrom(tp.client, 41000)
	enc := pktgen.Geneve{Outer: pktgen.Packet{SrcMAC: tp.lbMAC, DstMAC: tp.beMAC, Src: tp.lbAddr, Dst: tp.beAddr},
		VNI: 2, Options: []pktgen.GeneveOption{pktgen.DSROption(vip)}}
	const iss = 7000
	send := func(seq, ack uint32, flags pktgen.TCPFlags, payload []byte) {
		t.Helper()
		inner := pktgen.Packet{Src: client.Addr(), Dst: backend.Addr(), SrcPort: client.Port(), DstPort: backend.Port(),
			Seq: seq, Ack: ack, Window: 65535, Flags: flags, Payload: payload}
		if _, err := unix.Write(fd, enc.Frame(inner.IP())); err != nil {
			t.Fatalf("inject: %v", err)
		}
	}
	check := func(s segment) {
		t.Helper()
		if s.src != vip {
			t.Errorf("reply from %v, want %v", s.src, vip)
		}
		var err error
		if txOff {
			err = pktgen.VerifyIP(s.ip)
		} else {
			err = pktgen.VerifyPartial(s.ip)
		}
		if err != nil {
			t.Errorf("reply %v: %v", s.tcp.TransportFlow(), err)
		}
	}
	deadline := time.Now().Add(5 * time.Second)

	send(iss, 0, pktgen.SYN, nil)
	synAck := nextSegment(t, fd, client, deadline)
	check(synAck)
	if !synAck.tcp.SYN || !synAck.tcp.ACK || synAck.tcp.Ack != iss+1 {
		t.Fatalf("want SYN-ACK for %d, got %v", iss+1, synAck.tcp)
	}
	send(iss+1, synAck.tcp.Seq+1, pktgen.ACK, nil)
	select {
	case err := <-accepted:
		if err != nil {
			t.Fatalf("accept: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("handshake did not complete: no connection accepted")
	}
	send(iss+1, synAck.tcp.Seq+1, pktgen.ACK|pktgen.PSH, []byte("ping"))
	var data segment
	for data = nextSegment(t, fd, client, deadline); len(data.tcp.Payload) == 0; {
		check(data)
		data = nextSegment(t, fd, client, deadline)
	}
	check(data)
	if string(data.tcp.Payload) != "pong:ping" {
		t.Errorf("payload %q, want %q", data.tcp.Payload, "pong:ping")
	}

	e, err := d.LookupNAT(NATKey{Proto: ProtoTCP, Backend: backend, Client: client})
	if err != nil {
		t.Fatal(err)
	}
	if e.VIP != vip {
		t.Errorf("NAT entry VIP %v, want %v", e.VIP, vip)
	}
	cs, err := d.Counters()
	if err != nil {
		t.Fatal(err)
	}
	if cs[CounterDecapOK] < 3 || cs[CounterSNATDone] < 2 {
		t.Errorf("counters %v: want ≥3 decapsulated and ≥2 SNAT'ed", cs)
	}
}

// TestNetnsForeignGeneve puts another tunnel endpoint on the backend node, a UDP
// socket on port 6081 as a Geneve CNI would have, next to the TC programs. Geneve
// that is not lbd's (no option, another option class, lbd's option with another VNI),
// from an allowed LB node and from any other source, reaches that socket over the
// wire byte for byte; lbd's own Geneve is decapsulated and reaches the backend, and
// never the socket.
func TestNetnsForeignGeneve(t *testing.T) {
	testnet.Require(t, "ip", "ethtool")
	for _, tc := range []struct {
		name     string
		v6       bool
		stranger netip.Addr
		vip      netip.AddrPort
	}{
		{name: "IPv4", stranger: netip.MustParseAddr("198.18.201.9"), vip: netip.MustParseAddrPort("203.0.113.21:53")},
		{name: "IPv6", v6: true, stranger: netip.MustParseAddr("2001:db8:c9::9"), vip: netip.MustParseAddrPort("[2001:db8:f::21]:53")},
	} {
		t.Run(tc.name, func(t *testing.T) { testForeignGeneve(t, tc.v6, tc.stranger, tc.vip) })
	}
}

func testForeignGeneve(t *testing.T, v6 bool, stranger netip.Addr, vip netip.AddrPort) {
	tp := newTopo(t, v6, true)
	d := newDatapath(t)
	bits := 32
	if v6 {
		bits = 128
	}
	if err := d.AddAllowedSource(netip.PrefixFrom(tp.lbAddr, bits)); err != nil {
		t.Fatal(err)
	}
	var tunnel, backend net.PacketConn
	err := tp.beNS.DoErr(func() error {
		for _, attach := range []func(int) (link.Link, error){d.AttachIngress, d.AttachEgress} {
			l, err := attach(tp.beIdx)
			if err != nil {
				return err
			}
			t.Cleanup(func() { l.Close() })
		}
		var err error
		if tunnel, err = net.ListenPacket("udp", netip.AddrPortFrom(tp.beAddr, pktgen.GenevePort).String()); err != nil {
			return err
		}
		backend, err = net.ListenPacket("udp", netip.AddrPortFrom(tp.beAddr, 8080).String())
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tunnel.Close(); backend.Close() })

	fd := tp.lbNS.PacketSocket(t, tp.lbIf)
	client := netip.AddrPortFrom(tp.client, 41001)
	inner := func(payload string) []byte {
		return pktgen.Packet{Src: client.Addr(), Dst: tp.beAddr, SrcPort: client.Port(), DstPort: 8080,
			Proto: pktgen.ProtoUDP, Payload: []byte(payload)}.IP()
	}
	encap := func(src netip.Addr, vni uint32, opts ...pktgen.GeneveOption) pktgen.Geneve {
		return pktgen.Geneve{Outer: pktgen.Packet{SrcMAC: tp.lbMAC, DstMAC: tp.beMAC, Src: src, Dst: tp.beAddr, SrcPort: 33000},
			VNI: vni, Options: opts}
	}
	dsr := pktgen.DSROption(vip)

	// Foreign frames, each carrying an inner packet that would reach the backend if
	// it were decapsulated.
	type sent struct {
		name    string
		src     netip.Addr
		payload []byte // the UDP payload: Geneve header, options, inner frame
	}
	var foreign []sent
	for _, src := range []netip.Addr{tp.lbAddr, stranger} {
		for _, k := range []struct {
			name string
			g    pktgen.Geneve
		}{
			{"no option", encap(src, 2)},
			{"another option class", encap(src, 2, ovn)},
			{"lbd's option, another VNI", encap(src, 7, dsr)},
		} {
			frame := k.g.Frame(inner("foreign " + k.name))
			foreign = append(foreign, sent{name: fmt.Sprintf("from %v: %s", src, k.name), src: src,
				payload: frame[pktgen.Locate(frame).L4+8:]})
			if _, err := unix.Write(fd, frame); err != nil {
				t.Fatalf("inject: %v", err)
			}
		}
	}
	if _, err := unix.Write(fd, encap(tp.lbAddr, 2, dsr).Frame(inner("lbd"))); err != nil {
		t.Fatalf("inject: %v", err)
	}

	buf := make([]byte, 2048)
	tunnel.SetReadDeadline(time.Now().Add(5 * time.Second))
	for _, want := range foreign {
		n, from, err := tunnel.ReadFrom(buf)
		if err != nil {
			t.Fatalf("%s: the tunnel endpoint got nothing: %v", want.name, err)
		}
		if got := from.(*net.UDPAddr).AddrPort(); got != netip.AddrPortFrom(want.src, 33000) {
			t.Errorf("%s: from %v, want %v", want.name, got, netip.AddrPortFrom(want.src, 33000))
		}
		if !bytes.Equal(buf[:n], want.payload) {
			t.Errorf("%s: the tunnel endpoint got\n% x\nwant\n% x", want.name, buf[:n], want.payload)
		}
	}
	backend.SetReadDeadline(time.Now().Add(5 * time.Second))
	n, from, err := backend.ReadFrom(buf)
	if err != nil {
		t.Fatalf("lbd's packet did not reach the backend: %v", err)
	}
	if got := from.(*net.UDPAddr).AddrPort(); string(buf[:n]) != "lbd" || got.Addr().Unmap() != client.Addr() || got.Port() != client.Port() {
		t.Errorf("backend got %q from %v, want %q from %v", buf[:n], got, "lbd", client)
	}
	// Nothing more on either socket: lbd's packet did not go to the tunnel, and no
	// foreign one was decapsulated.
	for name, c := range map[string]net.PacketConn{"tunnel endpoint": tunnel, "backend": backend} {
		c.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
		if n, from, err := c.ReadFrom(buf); err == nil {
			t.Errorf("%s got another datagram from %v: % x", name, from, buf[:n])
		}
	}

	cs, err := d.Counters()
	if err != nil {
		t.Fatal(err)
	}
	if cs[CounterPassForeign] != uint64(len(foreign)) || cs[CounterDecapOK] != 1 || cs[CounterNATCreated] != 1 {
		t.Errorf("counters %v: want %d passed as foreign, 1 decapsulated with a NAT entry", cs, len(foreign))
	}
	for _, c := range AllCounters() {
		if c >= CounterDropNotAllowed && cs[c] != 0 {
			t.Errorf("counter %v = %d, want 0", c, cs[c])
		}
	}
}
