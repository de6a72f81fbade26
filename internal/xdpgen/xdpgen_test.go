//go:build linux

package xdpgen

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/lbd-dev/lbd/internal/pktgen"
	"github.com/lbd-dev/lbd/internal/testnet"
)

var (
	srcMAC = net.HardwareAddr{0x02, 0, 0, 0, 0x7a, 0x01}
	dstMAC = net.HardwareAddr{0x02, 0, 0, 0, 0x7a, 0x02}
	src    = netip.MustParseAddr("198.18.200.1")
	dst    = netip.MustParseAddr("203.0.113.77")
)

// template is a 64-byte frame (as Ethernet counts it, without the FCS: 60 bytes of
// frame) from src:sport to dst:80.
func template(proto uint8, flags pktgen.TCPFlags) []byte {
	p := pktgen.Packet{SrcMAC: srcMAC, DstMAC: dstMAC, Src: src, Dst: dst, Proto: proto,
		SrcPort: 40000, DstPort: 80, Flags: flags, Seq: 7777, Ack: 0}
	hdr := 14 + 20 + 8
	if proto == pktgen.ProtoTCP {
		hdr = 14 + 20 + 20
	}
	p.Payload = pktgen.Bytes(60 - hdr)
	return p.Frame()
}

func TestConfigRefused(t *testing.T) {
	tcp, udp := template(pktgen.ProtoTCP, pktgen.SYN), template(pktgen.ProtoUDP, 0)
	bad := func(f []byte, edit func(b []byte)) []byte {
		b := append([]byte(nil), f...)
		edit(b)
		return b
	}
	outside := pktgen.Packet{Src: netip.MustParseAddr("10.0.0.1"), Dst: dst, SrcPort: 1, DstPort: 2}.Frame()
	for name, c := range map[string]Config{
		"short":              {Frame: tcp[:40]},
		"IPv6":               {Frame: pktgen.Packet{Src: netip.MustParseAddr("2001:db8::1"), Dst: netip.MustParseAddr("2001:db8::2")}.Frame()},
		"IP options":         {Frame: pktgen.Packet{Src: src, Dst: dst, IPOptions: []byte{1, 1, 1, 1}}.Frame()},
		"bad IP checksum":    {Frame: bad(tcp, func(b []byte) { b[24]++ })},
		"bad L4 checksum":    {Frame: pktgen.Packet{Src: src, Dst: dst, BadL4Checksum: true}.Frame()},
		"fragment":           {Frame: pktgen.Packet{Src: src, Dst: dst, Fragment: &pktgen.Fragment{More: true}}.Frame()},
		"ICMP":               {Frame: pktgen.Packet{Src: src, Dst: dst, Proto: pktgen.ProtoICMPv4, ICMPType: 8}.Frame()},
		"SYN then ACK, UDP":  {Frame: udp, Mode: SynThenAck},
		"SYN then ACK, ACK":  {Frame: template(pktgen.ProtoTCP, pktgen.ACK), Mode: SynThenAck},
		"one flow, a range":  {Frame: tcp, Sources: 2},
		"ports wrap":         {Frame: tcp, Mode: NewFlow, Ports: 30000},
		"sources leave plan": {Frame: tcp, Mode: NewFlow, Sources: 1 << 17},
		"outside the plan":   {Frame: outside},
		"batch":              {Frame: tcp, Batch: 257},
		"mode":               {Frame: tcp, Mode: 9},
	} {
		if g, err := Load(c); err == nil {
			g.Close()
			t.Errorf("%s: loaded", name)
		} else if !strings.HasPrefix(err.Error(), "xdpgen: ") {
			t.Errorf("%s: %v", name, err)
		}
	}
}

func TestFlow(t *testing.T) {
	g := &Gen{cfg: Config{Frame: template(pktgen.ProtoTCP, pktgen.SYN), Mode: SynThenAck, Sources: 3, Ports: 2}}
	want := []string{
		"198.18.200.1:40000 S", "198.18.200.1:40000 A", "198.18.200.2:40000 S", "198.18.200.2:40000 A",
		"198.18.200.3:40000 S", "198.18.200.3:40000 A", "198.18.200.1:40001 S", "198.18.200.1:40001 A",
		"198.18.200.2:40001 S", "198.18.200.2:40001 A", "198.18.200.3:40001 S", "198.18.200.3:40001 A",
		"198.18.200.1:40000 S",
	}
	for n, w := range want {
		a, f := g.Flow(uint64(n))
		got := fmt.Sprintf("%v %s", a, map[pktgen.TCPFlags]string{pktgen.SYN: "S", pktgen.ACK: "A"}[f])
		if got != w {
			t.Errorf("packet %d: %s, want %s", n, got, w)
		}
	}
}

// pair is two namespaces joined by a veth: the injector sends out of a, b receives.
type pair struct {
	a, b     *testnet.NS
	ifA, ifB string
}

func newPair(t *testing.T) *pair {
	t.Helper()
	testnet.Require(t, "ip", "nsenter")
	sfx := testnet.Suffix(t)
	p := &pair{ifA: "xga" + sfx, ifB: "xgb" + sfx}
	p.a = testnet.NewNS(t, "xdpgen-"+sfx+"-a")
	p.b = testnet.NewNS(t, "xdpgen-"+sfx+"-b")
	testnet.Veth(t, testnet.VethEnd{NS: p.a, Name: p.ifA, MAC: srcMAC}, testnet.VethEnd{NS: p.b, Name: p.ifB, MAC: dstMAC})
	return p
}

func attachCounter(t testing.TB, ns *testnet.NS, ifname string, drop bool) *Counter {
	t.Helper()
	c, err := Count(ns, ifname, drop)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func load(t testing.TB, cfg Config) *Gen {
	t.Helper()
	g, err := Load(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.Close() })
	return g
}

// waitCount waits until the counter has seen want frames, or a second passes without
// a new one, and returns what it saw.
func waitCount(t testing.TB, c *Counter, want uint64) uint64 {
	t.Helper()
	var last uint64
	idle := time.Now()
	for {
		n, _, err := c.Packets()
		if err != nil {
			t.Fatal(err)
		}
		if n >= want {
			return n
		}
		if n != last {
			last, idle = n, time.Now()
		}
		if time.Since(idle) > time.Second {
			return n
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// xmitErrors reads how many frames the kernel refused to put on the veth's peer ring
// (ethtool's tx_queue_0_xdp_xmit_errors of the sending end): a frame sent while the
// receiving side has not yet drained its 256-slot ring is counted there, not lost silently.
func xmitErrors(t testing.TB, ns *testnet.NS, ifname string) uint64 {
	t.Helper()
	for _, line := range strings.Split(ns.Exec(t, "ethtool", "-S", ifname), "\n") {
		name, value, ok := strings.Cut(strings.TrimSpace(line), ":")
		if ok && name == "tx_queue_0_xdp_xmit_errors" {
			var n uint64
			if _, err := fmt.Sscan(strings.TrimSpace(value), &n); err != nil {
				t.Fatalf("ethtool -S %s: %q: %v", ifname, line, err)
			}
			return n
		}
	}
	t.Fatalf("ethtool -S %s has no tx_queue_0_xdp_xmit_errors", ifname)
	return 0
}

// TestSendArrives sends a million frames, one new flow each, and counts them at the
// peer: every frame sent arrives or is counted by the kernel as refused by the full
// veth ring (which happens when the receiving CPU is busy elsewhere, as on a loaded CI
// machine), and a second call continues where the first ended.
func TestSendArrives(t *testing.T) {
	testnet.Require(t, "ethtool")
	p := newPair(t)
	c := attachCounter(t, p.b, p.ifB, true)
	p.a.WaitUp(t, p.ifA)
	g := load(t, Config{Frame: template(pktgen.ProtoTCP, pktgen.SYN), Mode: NewFlow, Sources: 1 << 16, Ports: 100})
	const n = 1_000_000
	sent, dur, err := g.Send(p.a, p.ifA, n)
	if err != nil {
		t.Fatal(err)
	}
	refused := xmitErrors(t, p.a, p.ifA)
	got := waitCount(t, c, n-refused)
	t.Logf("sent %d frames in %v (%.2f Mpps); %d arrived, %d refused by the full veth ring",
		sent, dur, float64(sent)/dur.Seconds()/1e6, got, refused)
	if sent != n || got+refused != n || got == 0 {
		t.Fatalf("sent %d, %d arrived and %d refused; want %d sent, every one arrived or refused", sent, got, refused, n)
	}
	if sent, _, err = g.Send(p.a, p.ifA, 1000); err != nil || sent != 1000 {
		t.Fatalf("second call sent %d: %v", sent, err)
	}
	if next, err := g.Sent(); err != nil || next != n+1000 {
		t.Fatalf("sequence after both calls: %d, %v; want %d", next, err, n+1000)
	}
	refused = xmitErrors(t, p.a, p.ifA)
	if got := waitCount(t, c, n+1000-refused); got+refused != n+1000 {
		t.Fatalf("%d arrived and %d refused after the second call, want %d", got, refused, n+1000)
	}
}

// TestSendFrames captures what arrives in each mode: every frame is the flow the
// sequence says, in order, with valid checksums and the template's other bytes.
func TestSendFrames(t *testing.T) {
	p := newPair(t)
	attachCounter(t, p.b, p.ifB, false)
	p.a.WaitUp(t, p.ifA)
	for _, tc := range []struct {
		name string
		cfg  Config
		n    int
	}{
		{"one flow", Config{Frame: template(pktgen.ProtoTCP, pktgen.ACK), Mode: OneFlow}, 50},
		{"new flow TCP", Config{Frame: template(pktgen.ProtoTCP, pktgen.SYN), Mode: NewFlow, Sources: 7, Ports: 300}, 3000},
		{"new flow UDP", Config{Frame: template(pktgen.ProtoUDP, 0), Mode: NewFlow, Sources: 1000, Ports: 5}, 3000},
		{"new flow UDP without checksum", Config{Frame: pktgen.Packet{Src: src, Dst: dst, Proto: pktgen.ProtoUDP,
			SrcMAC: srcMAC, DstMAC: dstMAC, SrcPort: 9, DstPort: 53, NoUDPChecksum: true}.Frame(), Mode: NewFlow, Sources: 3, Ports: 3}, 100},
		{"SYN then ACK", Config{Frame: template(pktgen.ProtoTCP, pktgen.SYN), Mode: SynThenAck, Sources: 100, Ports: 1000}, 3000},
		{"ports only", Config{Frame: template(pktgen.ProtoTCP, pktgen.SYN), Mode: NewFlow, Ports: 20000}, 2000},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := load(t, tc.cfg)
			capture := p.b.Capture(t, p.ifB)
			sent, _, err := g.Send(p.a, p.ifA, tc.n)
			if err != nil || sent != tc.n {
				t.Fatalf("sent %d of %d: %v", sent, tc.n, err)
			}
			// Stop reads what is queued on the capture's socket.
			var frames [][]byte
			for _, f := range capture.Stop() {
				if !f.Outgoing && len(f.Data) >= l4Off && binary.BigEndian.Uint16(f.Data[12:]) == 0x0800 {
					frames = append(frames, f.Data)
				}
			}
			if len(frames) != tc.n {
				t.Fatalf("captured %d frames, want %d", len(frames), tc.n)
			}
			flows := map[netip.AddrPort]bool{}
			for i, f := range frames {
				if err := checkFrame(g, uint64(i), tc.cfg.Frame, f); err != nil {
					t.Fatalf("frame %d: %v", i, err)
				}
				a, _ := g.Flow(uint64(i))
				flows[a] = true
			}
			want := min(tc.n, g.cfg.Sources*g.cfg.Ports)
			if tc.cfg.Mode == SynThenAck {
				want = min(tc.n/2, g.cfg.Sources*g.cfg.Ports)
			}
			if len(flows) != want {
				t.Errorf("%d distinct flows, want %d", len(flows), want)
			}
		})
	}
}

// checkFrame compares frame n with what the template and the sequence make of it.
func checkFrame(g *Gen, n uint64, tmpl, f []byte) error {
	if len(f) != len(tmpl) {
		return fmt.Errorf("%d bytes, want %d", len(f), len(tmpl))
	}
	if err := pktgen.VerifyIP(f[ipOff:]); err != nil {
		return err
	}
	from, flags := g.Flow(n)
	want := append([]byte(nil), tmpl...)
	a := from.Addr().As4()
	copy(want[ipOff+12:], a[:])
	binary.BigEndian.PutUint16(want[l4Off:], from.Port())
	if tmpl[ipOff+9] == pktgen.ProtoTCP {
		if flags == pktgen.ACK && TCPFlags(tmpl) == pktgen.SYN {
			want[l4Off+13] = byte(pktgen.ACK)
			binary.BigEndian.PutUint32(want[l4Off+4:], binary.BigEndian.Uint32(tmpl[l4Off+4:])+1)
		}
	}
	// The checksums were verified; the rest must be the template's.
	for _, off := range []int{ipOff + 10, l4Off + 16, l4Off + 6} {
		if off == l4Off+16 && tmpl[ipOff+9] != pktgen.ProtoTCP || off == l4Off+6 && tmpl[ipOff+9] != pktgen.ProtoUDP {
			continue
		}
		copy(want[off:off+2], f[off:off+2])
	}
	if d := pktgen.Diff(want, f); d != "" {
		return fmt.Errorf("not the flow %v %v:\n%s", from, flags, d)
	}
	if tmpl[ipOff+9] == pktgen.ProtoUDP && binary.BigEndian.Uint16(tmpl[l4Off+6:]) == 0 && binary.BigEndian.Uint16(f[l4Off+6:]) != 0 {
		return fmt.Errorf("UDP checksum %#04x; the template had none", binary.BigEndian.Uint16(f[l4Off+6:]))
	}
	return nil
}

// BenchmarkSend measures the injector's rate into a veth whose peer counts and drops:
// the most any test topology behind it can be offered.
func BenchmarkSend(b *testing.B) {
	for _, mode := range []Mode{OneFlow, NewFlow, SynThenAck} {
		b.Run(strings.ReplaceAll(mode.String(), " ", "_"), func(b *testing.B) {
			testnet.Require(b, "ip", "nsenter")
			sfx := testnet.Suffix(b)
			a := testnet.NewNS(b, "xdpgen-"+sfx+"-a")
			r := testnet.NewNS(b, "xdpgen-"+sfx+"-b")
			testnet.Veth(b, testnet.VethEnd{NS: a, Name: "xga" + sfx}, testnet.VethEnd{NS: r, Name: "xgb" + sfx})
			c := attachCounter(b, r, "xgb"+sfx, true)
			a.WaitUp(b, "xga"+sfx)
			cfg := Config{Frame: template(pktgen.ProtoTCP, pktgen.SYN), Mode: mode}
			if mode != OneFlow {
				cfg.Sources, cfg.Ports = 1<<16, 1000
			}
			g := load(b, cfg)
			const n = 2_000_000
			var sent int
			var dur time.Duration
			for b.Loop() {
				s, d, err := g.Send(a, "xga"+sfx, n)
				if err != nil {
					b.Fatal(err)
				}
				sent, dur = sent+s, dur+d
			}
			got, _, err := c.Packets()
			if err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(float64(sent)/dur.Seconds()/1e6, "Mpps")
			b.ReportMetric(float64(got)/float64(sent), "arrived/sent")
			b.ReportMetric(0, "ns/op")
		})
	}
}

// TestPaced sends through a receiver slower than the injector, its NAPI polling on
// another CPU: unpaced, the receiver's ring overflows; paced by the counter's
// arrivals, every frame arrives.
func TestPaced(t *testing.T) {
	if runtime.NumCPU() < 2 {
		t.Skip("needs 2 CPUs")
	}
	p := newPair(t)
	pacer, err := NewPacer()
	if err != nil {
		t.Fatal(err)
	}
	defer pacer.Close()
	c, err := pacer.Count(p.b, p.ifB, false)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// The frames go on to the stack, which answers each SYN with a reset: far slower
	// than the injector.
	testnet.Run(t, "ip", "netns", "exec", p.b.Name, "sh", "-c", "echo 1 > /sys/class/net/"+p.ifB+"/threaded")
	p.a.WaitUp(t, p.ifA)
	const n = 200_000
	cfg := Config{Frame: template(pktgen.ProtoTCP, pktgen.SYN), Mode: NewFlow, Sources: 1 << 10, Ports: 1000, Pin: true, CPU: 0}
	g := load(t, cfg)
	sent, dur, err := g.Send(p.a, p.ifA, n)
	if err != nil {
		t.Fatal(err)
	}
	got := waitCount(t, c, n)
	t.Logf("unpaced: %d sent in %v, %d arrived", sent, dur, got)

	cfg.Pacer, cfg.Window = pacer, 128
	g = load(t, cfg)
	before, _, _ := c.Packets()
	sent, dur, err = g.Send(p.a, p.ifA, n)
	if err != nil {
		t.Fatal(err)
	}
	after := waitCount(t, c, before+n)
	t.Logf("paced: %d sent in %v (%.2f Mpps), %d arrived", sent, dur, float64(sent)/dur.Seconds()/1e6, after-before)
	if sent != n || after-before != n {
		t.Fatalf("paced: %d sent, %d arrived; want %d", sent, after-before, n)
	}
}

// TestPacedStall: a paced send whose frames are never counted (the peer's counter is
// not the pacer's) fails instead of waiting forever, having sent one window.
func TestPacedStall(t *testing.T) {
	p := newPair(t)
	attachCounter(t, p.b, p.ifB, true)
	p.a.WaitUp(t, p.ifA)
	pacer, err := NewPacer()
	if err != nil {
		t.Fatal(err)
	}
	defer pacer.Close()
	defer func(d time.Duration) { stallAfter = d }(stallAfter)
	stallAfter = 300 * time.Millisecond
	g := load(t, Config{Frame: template(pktgen.ProtoTCP, pktgen.SYN), Pacer: pacer, Window: 16})
	sent, _, err := g.Send(p.a, p.ifA, 1000)
	if err == nil || !strings.Contains(err.Error(), "stalled") || sent != 16 {
		t.Fatalf("sent %d of 1000 with nothing counted: %v; want 16 and a stall", sent, err)
	}
}
