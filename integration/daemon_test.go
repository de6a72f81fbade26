//go:build linux

package integration

import (
	"context"
	"fmt"
	"io/fs"
	"net"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/lbd-dev/lbd/bpf/lbxdp"
	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
)

// The netns acceptance tests of issue 5 (the restart ones are TestRestartDuringTransfer).

// ctKey identifies a conntrack entry and what it records.
func ctKey(c *lbdv1.Connection) string {
	return fmt.Sprintf("%v %s:%d -> %s:%d => %s:%d", c.GetProtocol(), c.GetClientAddress(), c.GetClientPort(),
		c.GetVip(), c.GetVipPort(), c.GetBackendAddress(), c.GetBackendPort())
}

// conntrackMaxEntries finds the pinned IPv4 conntrack map (lb_ct4) below a daemon's
// bpffs directory and returns its size: a quarter more than --conntrack-size.
func (d *daemon) conntrackMaxEntries(t *testing.T) uint32 {
	t.Helper()
	var size uint32
	err := filepath.WalkDir(d.bpffs, func(path string, e fs.DirEntry, err error) error {
		if err != nil || e.IsDir() || e.Name() != lbxdp.MapConntrack4 {
			return err
		}
		m, err := ebpf.LoadPinnedMap(path, &ebpf.LoadPinOptions{ReadOnly: true})
		if err != nil {
			return nil // a pinned program or link
		}
		defer m.Close()
		size = m.MaxEntries()
		return fs.SkipAll
	})
	if err != nil || size == 0 {
		t.Fatalf("%s: no pinned conntrack map below %s: %v", d.node.name, d.bpffs, err)
	}
	return size
}

// conntrackDump lists an LB node's conntrack entries with `lbctl conntrack list`.
func (d *daemon) conntrackDump(t *testing.T) map[string]bool {
	t.Helper()
	var resp lbdv1.ListConnectionsResponse
	d.lbctlJSON(t, &resp, "conntrack", "list", "--limit", "100000")
	if resp.GetTruncated() {
		t.Fatalf("%s: conntrack list truncated", d.node.name)
	}
	out := map[string]bool{}
	for _, c := range resp.GetConnections() {
		out[ctKey(c)] = true
	}
	return out
}

// TestRestartConntrackResize: restarting the LB daemons with a doubled conntrack size
// keeps every entry (`lbctl conntrack list` before and after) and every TCP stream.
func TestRestartConntrackResize(t *testing.T) {
	const size = 16384
	tb := newLB(t, options{conntrackSize: size})
	var streams []*stream
	for range 10 {
		streams = append(streams, tb.openStream(t, streamVIP))
	}
	for i := range 10 {
		c, err := tb.dial("udp", dnsVIP)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if _, err := ask(c, fmt.Sprint("resize ", i)); err != nil {
			t.Fatal(err)
		}
	}
	for _, lb := range tb.lbs {
		if got := lb.lbd.conntrackMaxEntries(t); got != size+size/4 {
			t.Fatalf("%s: conntrack holds %d entries, started with --conntrack-size %d (want a quarter more)", lb.name, got, size)
		}
		before := lb.lbd.conntrackDump(t)
		if len(before) == 0 {
			t.Fatalf("%s tracks no flow: nothing to keep", lb.name)
		}
		lb.lbd.crash()
		lb.lbd.conntrackSize = 2 * size
		lb.lbd.start(t)
		if got := lb.lbd.conntrackMaxEntries(t); got != 2*size+2*size/4 {
			t.Fatalf("%s: conntrack holds %d entries after restarting with --conntrack-size %d", lb.name, got, 2*size)
		}
		after := lb.lbd.conntrackDump(t)
		var lost []string
		for k := range before {
			if !after[k] {
				lost = append(lost, k)
			}
		}
		t.Logf("%s: %d entries before, %d after the resize", lb.name, len(before), len(after))
		if len(lost) > 0 {
			t.Errorf("%s lost %d of %d conntrack entries: %v", lb.name, len(lost), len(before), lost)
		}
	}
	for _, s := range streams {
		if err := s.progress(30, 5*time.Second); err != nil {
			t.Fatal(err)
		}
	}
}

// streamOn opens streams until one lands on the named backend, closing the others.
func (tb *testbed) streamOn(t *testing.T, to netip.AddrPort, backend string) *stream {
	t.Helper()
	for range 40 {
		s := tb.openStream(t, to)
		if b, _, _ := s.state(); b == backend {
			return s
		}
		s.close()
	}
	t.Fatalf("40 streams to %v, none on %s", to, backend)
	return nil
}

// TestDrainUndrain: a drained backend keeps its established connection, 100 new
// connections never reach it, and undraining brings it back.
func TestDrainUndrain(t *testing.T) {
	tb := newLB(t, options{})
	be := tb.backends[0]
	ap := netip.AddrPortFrom(be.addr4, echoPort).String()
	s := tb.streamOn(t, streamVIP, be.name)

	tb.lbctlLBs(t, "backend", "drain", "stream", ap)
	tb.waitSlots(t, "stream", netip.MustParseAddrPort(ap), func(n uint32) bool { return n == 0 })
	got := map[string]int{}
	for range 100 {
		got[tb.echoOnce(t, streamVIP)]++
	}
	t.Logf("new connections while %s drains: %v", be.name, got)
	if got[be.name] != 0 {
		t.Errorf("%d of 100 new connections reached the drained %s", got[be.name], be.name)
	}
	if err := s.progress(50, 5*time.Second); err != nil {
		t.Fatalf("established connection to the drained backend: %v", err)
	}

	tb.lbctlLBs(t, "backend", "undrain", "stream", ap)
	tb.waitSlots(t, "stream", netip.MustParseAddrPort(ap), func(n uint32) bool { return n > 0 })
	got = map[string]int{}
	for range 100 {
		got[tb.echoOnce(t, streamVIP)]++
	}
	t.Logf("new connections after undrain: %v", got)
	// An equal share is 33; 15 is four standard deviations below it.
	if got[be.name] < 15 {
		t.Errorf("%d of 100 new connections reached %s after undrain", got[be.name], be.name)
	}
	if err := s.progress(20, 5*time.Second); err != nil {
		t.Fatal(err)
	}
}

// TestDisable: disabling a backend stops new and existing flows to it; a UDP flow that
// was on it moves to another backend with its next datagram.
func TestDisable(t *testing.T) {
	tb := newLB(t, options{})
	be := tb.backends[0]
	s := tb.streamOn(t, streamVIP, be.name)

	var udpConn net.Conn
	var flow string
	for range 40 {
		c, err := tb.dial("udp", dnsVIP)
		if err != nil {
			t.Fatal(err)
		}
		ans, err := ask(c, "before")
		if err != nil {
			t.Fatal(err)
		}
		if ans.backend == be.name {
			udpConn, flow = c, c.LocalAddr().String()
			defer c.Close()
			break
		}
		c.Close()
	}
	if udpConn == nil {
		t.Fatalf("40 UDP flows, none on %s", be.name)
	}

	for _, svc := range []struct {
		name string
		port uint16
	}{{"stream", echoPort}, {"dns", udpPort}} {
		ap := netip.AddrPortFrom(be.addr4, svc.port)
		tb.lbctlLBs(t, "backend", "disable", svc.name, ap.String())
		tb.waitSlots(t, svc.name, ap, func(n uint32) bool { return n == 0 })
	}

	ans, err := ask(udpConn, "after")
	if err != nil {
		t.Fatal(err)
	}
	if ans.backend == be.name {
		t.Errorf("UDP flow %s still answered by the disabled %s", flow, be.name)
	}
	t.Logf("UDP flow %s moved from %s to %s", flow, be.name, ans.backend)

	err = s.failed(10 * time.Second)
	if err == nil {
		t.Errorf("the TCP stream to the disabled %s still works", be.name)
	} else {
		t.Logf("TCP stream to the disabled backend ended: %v", err)
	}
	for range 30 {
		if b := tb.echoOnce(t, streamVIP); b == be.name {
			t.Fatalf("a new connection reached the disabled %s", be.name)
		}
	}
}

// TestMetrics: the daemons' /metrics change as traffic flows: every LB node counts the
// service's packets, every backend node the Geneve packets it decapsulated.
func TestMetrics(t *testing.T) {
	tb := newLB(t, options{})
	series := func(n *node) string {
		if n.lbd.role == "lb" {
			return `lbd_service_packets_total{service="web"}`
		}
		return `lbd_datapath_packets_total{reason="backend_decap_ok"}`
	}
	before := map[*node]float64{}
	for _, n := range tb.nodes() {
		before[n] = parseMetrics(t, n.lbd.scrape(t))[series(n)]
	}
	tb.getMany(t, webVIP, 100)
	for _, n := range tb.nodes() {
		after, ok := parseMetrics(t, n.lbd.scrape(t))[series(n)]
		if !ok {
			t.Errorf("%s: /metrics has no series %s", n.name, series(n))
			continue
		}
		t.Logf("%s: %s %v -> %v", n.name, series(n), before[n], after)
		if after <= before[n] {
			t.Errorf("%s: %s did not grow with 100 requests (%v -> %v)", n.name, series(n), before[n], after)
		}
	}
}

// parseMetrics reads the Prometheus text format into series -> value.
func parseMetrics(t *testing.T, text string) map[string]float64 {
	t.Helper()
	out := map[string]float64{}
	for _, line := range strings.Split(text, "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			t.Fatalf("metrics line %q", line)
		}
		var v float64
		if _, err := fmt.Sscan(line[i+1:], &v); err != nil {
			t.Fatalf("metrics line %q: %v", line, err)
		}
		out[line[:i]] = v
	}
	return out
}

// TestSameBackendAcrossLBs: two LB nodes given the same desired state pick the same
// backend for 1,000 flows (asked with the TraceFlow RPC, which `lbctl trace` calls:
// 2,000 lbctl runs would take too long), and real flows reach the backend that
// `lbctl trace` names on either node.
func TestSameBackendAcrossLBs(t *testing.T) {
	tb := newLB(t, options{})
	trace := func(d *daemon, port uint16) (string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		resp, err := d.lb.TraceFlow(ctx, &lbdv1.TraceFlowRequest{
			Protocol: lbdv1.Protocol_PROTOCOL_TCP, SourceAddress: client4.String(), SourcePort: uint32(port),
			DestinationAddress: vip4.String(), DestinationPort: webPort,
		})
		if err != nil {
			return "", fmt.Errorf("%s: trace from port %d: %w", d.node.name, port, err)
		}
		if resp.GetBackend() == nil {
			return "", fmt.Errorf("%s: trace from port %d: no backend (%s: %s)", d.node.name, port,
				resp.GetVerdict(), resp.GetReason())
		}
		return netip.AddrPortFrom(netip.MustParseAddr(resp.GetBackend().GetAddress()),
			uint16(resp.GetBackend().GetPort())).String(), nil
	}
	share := map[string]int{}
	for port := uint16(40000); port < 41000; port++ {
		a, err := trace(tb.lbs[0].lbd, port)
		if err != nil {
			t.Fatal(err)
		}
		b, err := trace(tb.lbs[1].lbd, port)
		if err != nil {
			t.Fatal(err)
		}
		if a != b {
			t.Fatalf("flow from port %d: %s picks %s, %s picks %s", port, tb.lbs[0].name, a, tb.lbs[1].name, b)
		}
		share[a]++
	}
	t.Logf("1000 traced flows per backend: %v", share)
	if len(share) != len(tb.backends) {
		t.Fatalf("1000 flows reached %d backends", len(share))
	}

	// Real flows go where `lbctl trace` on either node says they go.
	for _, h := range tb.getMany(t, webVIP, 30) {
		be, err := tb.backendByName(h.backend)
		if err != nil {
			t.Fatal(err)
		}
		for _, lb := range tb.lbs {
			var resp lbdv1.TraceFlowResponse
			lb.lbd.lbctlJSON(t, &resp, "trace", "tcp", h.local.Addr().String(), fmt.Sprint(h.local.Port()),
				vip4.String(), fmt.Sprint(webPort))
			if got := resp.GetBackend().GetAddress(); got != be.addr4.String() {
				t.Errorf("flow from %v went to %s (%v); lbctl trace on %s says %q (%s: %s)", h.local, be.name,
					be.addr4, lb.name, got, resp.GetVerdict(), resp.GetReason())
			}
		}
	}
}
