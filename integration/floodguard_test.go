//go:build linux

package integration

import (
	"context"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/lbd-dev/lbd/internal/pktgen"
	"github.com/lbd-dev/lbd/internal/testnet"
	"github.com/lbd-dev/lbd/internal/xdpgen"
	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
	"google.golang.org/grpc"
)

// The new-connection flood of the issue "a SYN flood that harms no one": spoofed
// clients that each send a SYN and then an ACK, which an LRU conntrack cannot tell from
// established flows (docs/testing.md: a flood of one-packet flows evicts nothing; two
// packets per flow evicted every established entry).
const (
	// fgEstablished flows are in the LB node's conntrack before the flood.
	fgEstablished = 10_000
	// fgFloodFlows spoofed sources flood it: fgFloodAddrs addresses times 64 ports.
	fgFloodFlows = fgFloodAddrs * 64
	fgFloodAddrs = 1 << 15
	// fgConntrack is the LB node's conntrack size: room for the established flows
	// and a few times more, far from room for the flood.
	fgConntrack = 1 << 16
	// fgWindow is the injector's frames in flight: under the 256 frames of a veth's
	// ring, so that no queue on the path overflows and every flow reaches the LB
	// node twice.
	fgWindow = 128
)

var (
	// Client addresses that nothing answers: the router drops what is sent to them.
	fgEstNet   = netip.MustParsePrefix("198.19.64.0/18")
	fgFloodNet = netip.MustParsePrefix("198.19.128.0/17")
)

// TestFloodGuard fills the LB node's conntrack with 10,000 established flows, records
// their backends, then floods it with 2,097,152 spoofed flows of a SYN and an ACK each,
// paced to what the path delivers, while normal HTTP connections are made through the
// VIP. Afterwards every established flow must still have its entry on the same
// backend, every normal connection must have been answered, and the datapath's
// conntrack events must show that the flood guard engaged and skipped recording flows.
func TestFloodGuard(t *testing.T) {
	tb := newTestbed(t, options{lbs: 1, conntrackSize: fgConntrack})
	tb.startLBD()
	lb := tb.lbs[0].lbd
	// Replies to the spoofed clients die where they start: the backends' work for them
	// is the TCP stack's, not the fabric's, which leaves more of the machine's two CPUs
	// to the flood.
	for _, ns := range []*testnet.NS{tb.routerNS, tb.backends[0].ns, tb.backends[1].ns, tb.backends[2].ns} {
		ns.IP(t, "route add blackhole "+fgEstNet.String(), "route add blackhole "+fgFloodNet.String())
	}

	// The backends' counters tell the injector what arrived; the router's is the XDP
	// program the injector's veth needs on its peer, and counts what reached the router.
	pacer, err := xdpgen.NewPacer()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pacer.Close() })
	for _, be := range tb.backends {
		c, err := pacer.Count(be.ns, be.ifc, false)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
	}
	atRouter, err := xdpgen.Count(tb.routerNS, tb.routerCIf, false)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { atRouter.Close() })
	clientMAC := tb.clientNS.Interface(t, tb.clientIf).HardwareAddr
	routerMAC := tb.routerNS.Interface(t, tb.routerCIf).HardwareAddr
	injector := func(from netip.Addr, port uint16, addrs, ports int) *xdpgen.Gen {
		t.Helper()
		g, err := xdpgen.Load(xdpgen.Config{
			Frame: pktgen.Packet{SrcMAC: clientMAC, DstMAC: routerMAC, Src: from, Dst: vip4,
				SrcPort: port, DstPort: webPort, Flags: pktgen.SYN}.Frame(),
			Mode: xdpgen.SynThenAck, Sources: addrs, Ports: ports, Pacer: pacer, Window: fgWindow,
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { g.Close() })
		return g
	}

	// The established flows: each a SYN, then an ACK, through the router.
	est := injector(fgEstNet.Addr(), 20000, fgEstablished, 1)
	if sent, _, err := est.Send(tb.clientNS, tb.clientIf, 2*fgEstablished); err != nil || sent != 2*fgEstablished {
		t.Fatalf("established flows: %d of %d packets sent: %v", sent, 2*fgEstablished, err)
	}
	want := map[netip.AddrPort]string{}
	for n := uint64(0); n < 2*fgEstablished; n += 2 {
		from, _ := est.Flow(n)
		want[from] = ""
	}
	var recorded map[netip.AddrPort]string
	eventually(t, 10*time.Second, func() error {
		recorded = lb.conntrackOf(t, want)
		if len(recorded) != fgEstablished {
			return fmt.Errorf("%d of the %d established flows are in the conntrack", len(recorded), fgEstablished)
		}
		return nil
	})
	perBackend := map[string]int{}
	for _, b := range recorded {
		perBackend[b]++
	}
	t.Logf("%d established flows recorded, per backend: %v", len(recorded), perBackend)

	// The flood, and normal connections while it lasts.
	flows0 := lb.serviceStats(t, "web").GetNewFlows()
	router0, _, _ := atRouter.Packets()
	arrived0, err := pacer.Arrived()
	if err != nil {
		t.Fatal(err)
	}
	flood := injector(fgFloodNet.Addr(), 1024, fgFloodAddrs, 64)
	type result struct {
		sent int
		dur  time.Duration
		err  error
	}
	done := make(chan result, 1)
	start := time.Now()
	go func() {
		var r result
		r.sent, r.dur, r.err = flood.Send(tb.clientNS, tb.clientIf, 2*fgFloodFlows)
		done <- r
	}()
	var gets []error
	var res result
	for waiting := true; waiting; {
		select {
		case res = <-done:
			waiting = false
		case <-time.After(500 * time.Millisecond):
			_, err := tb.get(webVIP)
			gets = append(gets, err)
		}
	}
	wall := time.Since(start)
	if res.err != nil || res.sent != 2*fgFloodFlows {
		t.Fatalf("flood: %d of %d packets sent: %v", res.sent, 2*fgFloodFlows, res.err)
	}
	// The last window of frames is still on its way.
	var arrived1 uint64
	eventually(t, 5*time.Second, func() error {
		if arrived1, err = pacer.Arrived(); err == nil && arrived1-arrived0 < 2*fgFloodFlows {
			err = fmt.Errorf("%d of %d flood packets reached the backends", arrived1-arrived0, 2*fgFloodFlows)
		}
		return err
	})
	router1, _, _ := atRouter.Packets()
	flows1 := lb.serviceStats(t, "web").GetNewFlows()
	t.Logf("flood: %d packets (%d flows, each a SYN then an ACK) sent in %v: %.0f packets/s, %.0f new flows/s; "+
		"%d reached the router, %d the backends (with the HTTP requests'); lbd counted %d new flows; "+
		"%d HTTP requests during the flood (%v)",
		res.sent, res.sent/2, res.dur.Round(time.Millisecond), float64(res.sent)/res.dur.Seconds(), float64(res.sent)/2/res.dur.Seconds(),
		router1-router0, arrived1-arrived0, flows1-flows0, len(gets), wall.Round(time.Millisecond))

	t.Run("established flows kept", func(t *testing.T) {
		after := lb.conntrackOf(t, recorded)
		var lost, moved int
		for from, b := range recorded {
			switch a, ok := after[from]; {
			case !ok:
				lost++
			case a != b:
				moved++
			}
		}
		t.Logf("of %d established flows: %d lost their conntrack entry, %d changed backend", len(recorded), lost, moved)
		if lost+moved > 0 {
			t.Errorf("%d of %d established flows lost their entry and %d changed backend", lost, len(recorded), moved)
		}
	})
	t.Run("new connections answered", func(t *testing.T) {
		var failed int
		for _, err := range gets {
			if err != nil {
				failed++
				t.Log(err)
			}
		}
		if len(gets) < 3 || failed > 0 {
			t.Errorf("%d of %d HTTP requests during the flood failed (want at least 3, all answered)", failed, len(gets))
		}
	})
	t.Run("flood guard acted", func(t *testing.T) {
		ev := lb.conntrackEvents(t)
		t.Logf("conntrack events: %v", ev)
		if ev["guard_engaged"] == 0 || ev["guard_skipped"] == 0 {
			t.Errorf("guard_engaged %d, guard_skipped %d: the flood guard did not act (events: %v)",
				ev["guard_engaged"], ev["guard_skipped"], ev)
		}
	})
}

// conntrackOf returns the backend ("address:port") of each flow of a set that has an
// entry in the daemon's conntrack.
func (d *daemon) conntrackOf(t *testing.T, flows map[netip.AddrPort]string) map[netip.AddrPort]string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// Every entry: the table may hold up to fgConntrack of them, more than the
	// default limit and the default message size allow.
	resp, err := d.lb.ListConnections(ctx, &lbdv1.ListConnectionsRequest{Vip: vip4.String(), Limit: 1 << 22},
		grpc.MaxCallRecvMsgSize(1<<30))
	if err != nil {
		t.Fatalf("%s: list connections: %v", d.node.name, err)
	}
	if resp.GetTruncated() {
		t.Fatalf("%s: connection list truncated at %d", d.node.name, len(resp.GetConnections()))
	}
	out := map[netip.AddrPort]string{}
	for _, c := range resp.GetConnections() {
		a, err := netip.ParseAddr(c.GetClientAddress())
		if err != nil {
			t.Fatalf("connection %v: %v", c, err)
		}
		from := netip.AddrPortFrom(a, uint16(c.GetClientPort()))
		if _, ok := flows[from]; ok {
			out[from] = fmt.Sprintf("%s:%d", c.GetBackendAddress(), c.GetBackendPort())
		}
	}
	return out
}

// conntrackEvents returns the LB datapath's conntrack events by name.
func (d *daemon) conntrackEvents(t *testing.T) map[string]uint64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := d.lb.GetStats(ctx, &lbdv1.GetStatsRequest{})
	if err != nil {
		t.Fatalf("%s: stats: %v", d.node.name, err)
	}
	ev := map[string]uint64{}
	for _, e := range resp.GetConntrackEvents() {
		ev[e.GetName()] = e.GetCount()
	}
	return ev
}
