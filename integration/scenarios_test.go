//go:build linux

package integration

import (
	"context"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
	"github.com/gopacket/gopacket/pcapgo"
	"github.com/lbd-dev/lbd/internal/testnet"
	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
)

// The end-to-end scenarios of issue 6. Each builds its own testbed (about 3 s).

var (
	webVIP    = netip.AddrPortFrom(vip4, webPort)
	streamVIP = netip.AddrPortFrom(vip4, streamPt)
	dnsVIP    = netip.AddrPortFrom(vip4, dnsPort)
)

// newLB is a testbed with every daemon running and the default services created.
func newLB(t *testing.T, opts options) *testbed {
	t.Helper()
	tb := newTestbed(t, opts)
	tb.startLBD()
	return tb
}

// TestHTTPShare: 300 HTTP requests from distinct client ports all succeed, spread over
// the backends within ±30% of an equal split and over both LB nodes, and every backend
// sees the real client address and port.
func TestHTTPShare(t *testing.T) {
	tb := newLB(t, options{})
	const n = 300
	hs := tb.getMany(t, webVIP, n)
	for _, h := range hs {
		if h.seen != h.local.String() {
			t.Fatalf("backend %s saw client %s, the client was %v", h.backend, h.seen, h.local)
		}
	}
	counts := perBackend(hs)
	t.Logf("requests per backend: %v", counts)
	want := n / len(tb.backends)
	for _, be := range tb.backends {
		if c := counts[be.name]; c < want*7/10 || c > want*13/10 {
			t.Errorf("%s got %d of %d requests, want %d ±30%%", be.name, c, n, want)
		}
	}
	var total uint64
	for _, lb := range tb.lbs {
		flows := lb.lbd.serviceStats(t, "web").GetNewFlows()
		t.Logf("%s: %d new flows", lb.name, flows)
		if flows == 0 {
			t.Errorf("%s carried no flow: the router is not spreading over the LB nodes", lb.name)
		}
		total += flows
	}
	if total != n {
		t.Errorf("LB nodes counted %d new flows, want %d", total, n)
	}
}

// serviceStats returns a service's counters on one LB node.
func (d *daemon) serviceStats(t *testing.T, name string) *lbdv1.ServiceStats {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := d.lb.GetStats(ctx, &lbdv1.GetStatsRequest{})
	if err != nil {
		t.Fatalf("%s: stats: %v", d.node.name, err)
	}
	for _, s := range resp.GetServices() {
		if s.GetServiceName() == name {
			return s
		}
	}
	t.Fatalf("%s: no stats for service %s", d.node.name, name)
	return nil
}

// reasonCount returns the packets of one drop/verdict reason on one LB node.
func (d *daemon) reasonCount(t *testing.T, reason string) uint64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := d.lb.GetStats(ctx, &lbdv1.GetStatsRequest{})
	if err != nil {
		t.Fatalf("%s: stats: %v", d.node.name, err)
	}
	var names []string
	for _, c := range resp.GetReasons() {
		if c.GetName() == reason {
			return c.GetPackets()
		}
		names = append(names, c.GetName())
	}
	t.Fatalf("%s: no counter %q among %v", d.node.name, reason, names)
	return 0
}

// decoded is a captured frame's outer IP addresses and L4 ports.
type decoded struct {
	src, dst           netip.Addr
	sport, dport       uint16
	geneve             *layers.Geneve
	innerSrc, innerDst netip.Addr
}

func decode(f testnet.Frame) (decoded, bool) {
	pkt := gopacket.NewPacket(f.Data, layers.LayerTypeEthernet, gopacket.DecodeOptions{Lazy: true, NoCopy: true})
	var d decoded
	nl := pkt.NetworkLayer()
	if nl == nil {
		return d, false
	}
	d.src, _ = netip.AddrFromSlice(nl.NetworkFlow().Src().Raw())
	d.dst, _ = netip.AddrFromSlice(nl.NetworkFlow().Dst().Raw())
	if tl := pkt.TransportLayer(); tl != nil {
		f := tl.TransportFlow()
		if len(f.Src().Raw()) == 2 {
			d.sport = uint16(f.Src().Raw()[0])<<8 | uint16(f.Src().Raw()[1])
			d.dport = uint16(f.Dst().Raw()[0])<<8 | uint16(f.Dst().Raw()[1])
		}
	}
	if g, ok := pkt.Layer(layers.LayerTypeGeneve).(*layers.Geneve); ok {
		d.geneve = g
		// The inner frame's network layer is the second one in the packet.
		var ips []gopacket.Layer
		for _, l := range pkt.Layers() {
			if l.LayerType() == layers.LayerTypeIPv4 || l.LayerType() == layers.LayerTypeIPv6 {
				ips = append(ips, l)
			}
		}
		if len(ips) == 2 {
			in := ips[1].(gopacket.NetworkLayer).NetworkFlow()
			d.innerSrc, _ = netip.AddrFromSlice(in.Src().Raw())
			d.innerDst, _ = netip.AddrFromSlice(in.Dst().Raw())
		}
	}
	return d, true
}

// TestDSR: replies never cross an LB node. The bridge ports of the LB nodes see the
// Geneve frames the LB nodes send but not one packet with the VIP as source, and
// every packet the client receives comes from VIP:port, none from a backend address.
func TestDSR(t *testing.T) {
	tb := newLB(t, options{})
	var lbCaps []*testnet.Capture
	for _, lb := range tb.lbs {
		lbCaps = append(lbCaps, tb.bridgeNS.Capture(t, lb.brIfc))
	}
	clientCap := tb.clientNS.Capture(t, tb.clientIf)

	tb.getMany(t, webVIP, 50)
	for range 10 {
		c, err := tb.dial("udp", dnsVIP)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := ask(c, "dsr"); err != nil {
			t.Fatal(err)
		}
		c.Close()
	}
	if _, err := tb.download(10<<20, webVIP); err != nil {
		t.Fatal(err)
	}

	for i, lb := range tb.lbs {
		var geneve, fromVIP int
		for _, f := range lbCaps[i].Stop() {
			d, ok := decode(f)
			if !ok {
				continue
			}
			if d.geneve != nil && !f.Outgoing && d.src == lb.addr4 {
				geneve++
			}
			if d.src == vip4 || d.innerSrc == vip4 {
				fromVIP++
			}
		}
		t.Logf("%s: %d Geneve frames sent, %d frames from the VIP", lb.name, geneve, fromVIP)
		if geneve == 0 {
			t.Errorf("%s sent no Geneve frame: the capture saw nothing of its traffic", lb.name)
		}
		if fromVIP != 0 {
			t.Errorf("%d frames with source VIP crossed %s", fromVIP, lb.name)
		}
	}
	var received int
	for _, f := range clientCap.Stop() {
		d, ok := decode(f)
		if !ok || f.Outgoing || !d.dst.IsValid() || d.dst != client4 {
			continue
		}
		received++
		switch {
		case d.src != vip4:
			t.Errorf("client received a packet from %v:%d", d.src, d.sport)
		case d.sport != webPort && d.sport != dnsPort:
			t.Errorf("client received a packet from the VIP's port %d", d.sport)
		}
	}
	if received == 0 {
		t.Fatal("the client's capture saw no reply")
	}
	t.Logf("client received %d packets, all from the VIP", received)
}

// TestUDP: request and response through the VIP; a flow (a client port) stays on one
// backend, the backend sees the real client, the answer comes from VIP:port (the
// connected socket accepts nothing else), and flows spread over the backends.
func TestUDP(t *testing.T) {
	tb := newLB(t, options{})
	seen := map[string]int{}
	for i := range 30 {
		c, err := tb.dial("udp", dnsVIP)
		if err != nil {
			t.Fatal(err)
		}
		var first string
		for j := range 3 {
			payload := fmt.Sprintf("flow %d datagram %d", i, j)
			ans, err := ask(c, payload)
			if err != nil {
				t.Fatal(err)
			}
			if ans.seen != c.LocalAddr().String() || ans.payload != payload {
				t.Fatalf("flow %v: answer %+v", c.LocalAddr(), ans)
			}
			if first == "" {
				first = ans.backend
			} else if ans.backend != first {
				t.Fatalf("flow %v moved from %s to %s", c.LocalAddr(), first, ans.backend)
			}
		}
		seen[first]++
		c.Close()
	}
	t.Logf("UDP flows per backend: %v", seen)
	if len(seen) < 2 {
		t.Errorf("30 UDP flows all went to %v", seen)
	}
}

// TestLBNodeLoss: a long-lived TCP connection survives the loss of the LB node that
// carries it. The router stops using that node, the flow lands on the other one, which
// has no conntrack entry for it but picks the same backend from the same Maglev table.
func TestLBNodeLoss(t *testing.T) {
	tb := newLB(t, options{})
	s := tb.openStream(t, streamVIP)
	if err := s.progress(20, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	from, backend := tb.carrier(t, s.local)
	var other *node
	for _, lb := range tb.lbs {
		if lb != from {
			other = lb
		}
	}
	t.Logf("stream from %v: %s -> %s; removing %s from the router", s.local, from.name, backend, from.name)
	tb.router.setNextHops(t, other)
	if err := s.progress(100, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	// The lost node keeps its (now idle) entry until it expires; the survivor must
	// have created one with the same backend.
	if got := other.lbd.flowBackend(t, s.local); got != backend {
		t.Fatalf("%s's conntrack has the flow on backend %q, want %s", other.name, got, backend)
	}
}

// echoOnce opens a connection to the echo service, exchanges one line and closes it,
// returning the backend that answered.
func (tb *testbed) echoOnce(t *testing.T, to netip.AddrPort) string {
	t.Helper()
	s := tb.openStream(t, to)
	s.close()
	b, _, _ := s.state()
	return b
}

// streamsOnEveryBackend opens streams until each backend carries one, closing the
// surplus.
func (tb *testbed) streamsOnEveryBackend(t *testing.T, to netip.AddrPort) map[string]*stream {
	t.Helper()
	out := map[string]*stream{}
	for range 60 {
		if len(out) == len(tb.backends) {
			return out
		}
		s := tb.openStream(t, to)
		b, _, _ := s.state()
		if out[b] == nil {
			out[b] = s
		} else {
			s.close()
		}
	}
	t.Fatalf("60 streams reached only %d backends", len(out))
	return nil
}

// TestBackendChanges: removing a backend leaves the connections to the others
// untouched; draining keeps the drained backend's own connections; adding a backend
// takes new flows without moving established ones (a stream fails if its echo comes
// from another backend).
func TestBackendChanges(t *testing.T) {
	tb := newLB(t, options{})
	streams := tb.streamsOnEveryBackend(t, streamVIP)
	be1, be2, be3 := tb.backends[0], tb.backends[1], tb.backends[2]
	ap := func(be *node) netip.AddrPort { return netip.AddrPortFrom(be.addr4, echoPort) }

	t.Log("remove be3")
	tb.lbctlLBs(t, "backend", "remove", "stream", ap(be3).String())
	tb.waitService(t, "stream", func(s *lbdv1.Service) error {
		if len(s.GetBackends()) != 2 {
			return fmt.Errorf("%d backends", len(s.GetBackends()))
		}
		return nil
	})
	streams[be3.name].close()
	for _, be := range []*node{be1, be2} {
		if err := streams[be.name].progress(30, 5*time.Second); err != nil {
			t.Fatalf("stream on %s after removing be3: %v", be.name, err)
		}
	}

	t.Log("drain be2")
	tb.lbctlLBs(t, "backend", "drain", "stream", ap(be2).String())
	tb.waitSlots(t, "stream", ap(be2), func(n uint32) bool { return n == 0 })
	if err := streams[be2.name].progress(30, 5*time.Second); err != nil {
		t.Fatalf("stream on drained be2: %v", err)
	}
	for range 20 {
		if b := tb.echoOnce(t, streamVIP); b != be1.name {
			t.Fatalf("new connection went to %s; be2 is drained and be3 removed", b)
		}
	}
	tb.lbctlLBs(t, "backend", "undrain", "stream", ap(be2).String())
	tb.waitSlots(t, "stream", ap(be2), func(n uint32) bool { return n > 0 })

	t.Log("add be3 back")
	tb.lbctlLBs(t, "backend", "add", "stream", ap(be3).String())
	tb.waitSlots(t, "stream", ap(be3), func(n uint32) bool { return n > 0 })
	got := map[string]int{}
	for range 60 {
		got[tb.echoOnce(t, streamVIP)]++
	}
	t.Logf("new connections after adding be3: %v", got)
	if got[be3.name] == 0 {
		t.Errorf("no new connection reached the added backend")
	}
	for _, be := range []*node{be1, be2} {
		if err := streams[be.name].progress(30, 5*time.Second); err != nil {
			t.Fatalf("stream on %s after adding be3: %v", be.name, err)
		}
	}
}

// TestRestartDuringTransfer: SIGKILL every LB daemon and start them again, then every
// backend daemon, while TCP streams echo data and a throttled upload runs: no stream
// resets, no byte of the upload is lost (issue 5's restart acceptance, issue 6's
// scenario 6).
func TestRestartDuringTransfer(t *testing.T) {
	tb := newLB(t, options{})
	var streams []*stream
	for range 6 {
		streams = append(streams, tb.openStream(t, streamVIP))
	}
	const n = 48 << 20
	upload := make(chan error, 1)
	go func() {
		_, err := tb.httpUpload(n, webVIP, &throttled{r: &patternReader{n: n}, rate: 8 << 20, start: time.Now()})
		upload <- err
	}()
	for _, role := range []string{"lb", "backend"} {
		var ds []*daemon
		for _, nd := range tb.nodes() {
			if nd.lbd.role == role {
				ds = append(ds, nd.lbd)
			}
		}
		t.Logf("SIGKILL every %s daemon", role)
		for _, d := range ds {
			d.crash()
		}
		select {
		case err := <-upload:
			t.Fatalf("the upload ended (%v) before every daemon was killed: it proves nothing", err)
		default:
		}
		for _, s := range streams {
			if err := s.progress(30, 5*time.Second); err != nil {
				t.Fatalf("while the %s daemons are down: %v", role, err)
			}
		}
		for _, d := range ds {
			d.start(t)
		}
		for _, s := range streams {
			if err := s.progress(30, 5*time.Second); err != nil {
				t.Fatalf("after restarting the %s daemons: %v", role, err)
			}
		}
	}
	select {
	case err := <-upload:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("upload did not finish")
	}
}

// throttled reads from r at about rate bytes per second.
type throttled struct {
	r     io.Reader
	rate  float64
	start time.Time
	done  int64
}

func (t *throttled) Read(b []byte) (int, error) {
	if ahead := time.Duration(float64(t.done)/t.rate*float64(time.Second)) - time.Since(t.start); ahead > 0 {
		time.Sleep(ahead)
	}
	n, err := t.r.Read(b[:min(len(b), 32<<10)])
	t.done += int64(n)
	return n, err
}

// download fetches n pattern bytes over one connection and checks every byte.
func (tb *testbed) download(n int64, to netip.AddrPort) (time.Duration, error) {
	start := time.Now()
	_, err := tb.httpDo(http.MethodGet, to, fmt.Sprintf("/bytes?n=%d", n), nil, 0, 90*time.Second,
		func(r *http.Response) error {
			got, err := checkPattern(r.Body)
			if err != nil {
				return err
			}
			if got != n {
				return fmt.Errorf("received %d bytes, want %d", got, n)
			}
			return nil
		})
	return time.Since(start), err
}

// upload sends n pattern bytes over one connection; the backend checks every byte.
func (tb *testbed) upload(n int64, to netip.AddrPort) (time.Duration, error) {
	return tb.httpUpload(n, to, &patternReader{n: n})
}

// httpUpload posts n bytes read from body, which must be the pattern.
func (tb *testbed) httpUpload(n int64, to netip.AddrPort, body io.Reader) (time.Duration, error) {
	start := time.Now()
	var answer string
	_, err := tb.httpDo(http.MethodPost, to, "/upload", body, n, 90*time.Second,
		func(r *http.Response) error {
			var buf [128]byte
			k, _ := r.Body.Read(buf[:])
			answer = string(buf[:k])
			return nil
		})
	if err == nil && !strings.Contains(answer, fmt.Sprintf(" n=%d", n)) {
		err = fmt.Errorf("upload of %d bytes: backend answered %q", n, answer)
	}
	return time.Since(start), err
}

// TestTransfer100MB: 100 MB down and 100 MB up through the VIP, every byte checked.
func TestTransfer100MB(t *testing.T) {
	tb := newLB(t, options{})
	const n = 100 << 20
	d, err := tb.download(n, webVIP)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("download: 100 MB in %v (%.0f Mbit/s)", d.Round(time.Millisecond), float64(n)*8/d.Seconds()/1e6)
	d, err = tb.upload(n, webVIP)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("upload: 100 MB in %v (%.0f Mbit/s)", d.Round(time.Millisecond), float64(n)*8/d.Seconds()/1e6)
}

// TestPathMTU: on a 1500-byte fabric a full-size client packet no longer fits once
// encapsulated. The LB answers with ICMP "fragmentation needed", the client learns
// the smaller path MTU, and the upload completes.
func TestPathMTU(t *testing.T) {
	tb := newLB(t, options{fabricMTU: 1500, noAdvmss: true})
	var before uint64
	for _, lb := range tb.lbs {
		before += lb.lbd.reasonCount(t, "lb_drop_too_big")
	}
	const n = 20 << 20
	if _, err := tb.upload(n, webVIP); err != nil {
		t.Fatal(err)
	}
	var after uint64
	for _, lb := range tb.lbs {
		after += lb.lbd.reasonCount(t, "lb_drop_too_big")
	}
	if after == before {
		t.Error("no LB node counted a too-big packet: the upload never needed the ICMP path")
	}
	route := testnet.Run(t, "ip", "-n", tb.clientNS.Name, "route", "get", vip4.String())
	want := fmt.Sprintf("mtu %d", 1500-62)
	if !strings.Contains(route, want) {
		t.Errorf("client route to the VIP: %q, want the learnt %q", strings.TrimSpace(route), want)
	}
	t.Logf("too-big packets: %d; client route: %s", after-before, strings.Join(strings.Fields(route), " "))
}

// TestPathMTUv6: the same over IPv6: an IPv6 client packet that no longer fits the
// 1500-byte fabric once wrapped in IPv6, UDP, Geneve and the 24-byte IPv6 DSR option is
// answered with ICMPv6 "packet too big" carrying 1500 minus that overhead (94 bytes,
// the inner Ethernet header included); the client learns it and the upload completes.
func TestPathMTUv6(t *testing.T) {
	tb := newLB(t, options{fabricMTU: 1500, noAdvmss: true})
	var web6 []string
	for _, be := range tb.backends {
		web6 = append(web6, netip.AddrPortFrom(be.addr6, httpPort).String())
	}
	tb.createService(t, svcSpec{"web6", vip6, webPort, "tcp", web6})
	var before uint64
	for _, lb := range tb.lbs {
		before += lb.lbd.reasonCount(t, "lb_drop_too_big")
	}
	const n = 20 << 20
	if _, err := tb.upload(n, netip.AddrPortFrom(vip6, webPort)); err != nil {
		t.Fatal(err)
	}
	var after uint64
	for _, lb := range tb.lbs {
		after += lb.lbd.reasonCount(t, "lb_drop_too_big")
	}
	if after == before {
		t.Error("no LB node counted a too-big packet: the upload never needed the ICMPv6 path")
	}
	route := testnet.Run(t, "ip", "-n", tb.clientNS.Name, "-6", "route", "get", vip6.String())
	want := fmt.Sprintf("mtu %d", 1500-94)
	if !strings.Contains(route, want) {
		t.Errorf("client route to the VIP: %q, want the learnt %q", strings.TrimSpace(route), want)
	}
	t.Logf("too-big packets: %d; client route: %s", after-before, strings.Join(strings.Fields(route), " "))
}

// TestIPv6VIP: an IPv6 VIP end to end, over an IPv6 fabric and over the IPv4 fabric
// (backends given an IPv4 node address), TCP and UDP.
func TestIPv6VIP(t *testing.T) {
	tb := newLB(t, options{})
	var web6, web6v4, dns6 []string
	for _, be := range tb.backends {
		web6 = append(web6, netip.AddrPortFrom(be.addr6, httpPort).String())
		web6v4 = append(web6v4, netip.AddrPortFrom(be.addr6, httpPort).String()+",node="+be.addr4.String())
		dns6 = append(dns6, netip.AddrPortFrom(be.addr6, udpPort).String())
	}
	tb.createService(t, svcSpec{"web6", vip6, webPort, "tcp", web6})
	tb.createService(t, svcSpec{"web6v4", vip6, httpPort, "tcp", web6v4})
	tb.createService(t, svcSpec{"dns6", vip6, dnsPort, "udp", dns6})

	for _, port := range []uint16{webPort, httpPort} {
		hs := tb.getMany(t, netip.AddrPortFrom(vip6, port), 60)
		for _, h := range hs {
			if h.seen != h.local.String() {
				t.Fatalf("port %d: backend %s saw client %s, the client was %v", port, h.backend, h.seen, h.local)
			}
		}
		counts := perBackend(hs)
		t.Logf("[%v]:%d: requests per backend %v", vip6, port, counts)
		if len(counts) < 2 {
			t.Errorf("[%v]:%d: 60 requests reached only %v", vip6, port, counts)
		}
	}
	if _, err := tb.download(10<<20, netip.AddrPortFrom(vip6, webPort)); err != nil {
		t.Fatal(err)
	}
	for i := range 10 {
		c, err := tb.dial("udp", netip.AddrPortFrom(vip6, dnsPort))
		if err != nil {
			t.Fatal(err)
		}
		payload := fmt.Sprint("v6 ", i)
		ans, err := ask(c, payload)
		c.Close()
		if err != nil {
			t.Fatal(err)
		}
		if ans.seen != c.LocalAddr().String() || ans.payload != payload {
			t.Fatalf("UDP over IPv6: answer %+v to %v", ans, c.LocalAddr())
		}
	}
}

// TestGeneveDecode: frames captured on the fabric decode with tshark, an independent
// decoder, as Geneve with option class 0x014B type 0x81 carrying the VIP and port.
func TestGeneveDecode(t *testing.T) {
	requireEnv(t, "tshark")
	tb := newLB(t, options{})
	var caps []*testnet.Capture
	for _, be := range tb.backends {
		caps = append(caps, tb.bridgeNS.Capture(t, be.brIfc))
	}
	tb.getMany(t, webVIP, 10)

	path := filepath.Join(tb.dir, "fabric.pcap")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	w := pcapgo.NewWriter(f)
	if err := w.WriteFileHeader(testnet.SnapLen, layers.LinkTypeEthernet); err != nil {
		t.Fatal(err)
	}
	var written int
	for _, c := range caps {
		for _, fr := range c.Stop() {
			if d, ok := decode(fr); ok && d.geneve != nil && fr.Outgoing {
				ci := gopacket.CaptureInfo{Timestamp: time.Now(), CaptureLength: len(fr.Data), Length: len(fr.Data)}
				if err := w.WritePacket(ci, fr.Data); err != nil {
					t.Fatal(err)
				}
				written++
			}
		}
	}
	f.Close()
	if written == 0 {
		t.Fatal("no Geneve frame reached a backend node")
	}
	out := testnet.Run(t, "tshark", "-r", path, "-T", "fields", "-E", "separator=|",
		"-e", "udp.dstport", "-e", "geneve.proto_type", "-e", "geneve.option.class", "-e", "geneve.option.type",
		"-e", "geneve.option.unknown.data", "-e", "ip.dst", "-e", "tcp.dstport")
	wantData := hex.EncodeToString(vip4.AsSlice()) + fmt.Sprintf("%04x", webPort) + "0000"
	backendNode := map[string]bool{}
	for _, be := range tb.backends {
		backendNode[be.addr4.String()] = true
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	t.Logf("tshark decoded %d frames, the first: %s", len(lines), lines[0])
	for _, l := range lines {
		fields := strings.Split(l, "|")
		if len(fields) != 7 {
			t.Fatalf("tshark line %q", l)
		}
		if fields[0] != "6081" || fields[1] != "0x6558" {
			t.Errorf("not Geneve carrying Ethernet: %q", l)
		}
		if fields[2] != "0x014b" || fields[3] != "0x81" {
			t.Errorf("option class %s type %s, want 0x014b 0x81: %q", fields[2], fields[3], l)
		}
		if fields[4] != wantData {
			t.Errorf("option data %s, want %s (VIP %v, port %d): %q", fields[4], wantData, vip4, webPort, l)
		}
		if outer, _, _ := strings.Cut(fields[5], ","); !backendNode[outer] {
			t.Errorf("outer destination %s is no backend node: %q", outer, l)
		}
		if fields[6] != fmt.Sprint(httpPort) {
			t.Errorf("inner TCP destination %s, want the backend port %d: %q", fields[6], httpPort, l)
		}
	}
}
