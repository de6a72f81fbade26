//go:build linux

package socklb

import (
	"fmt"
	"math"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/lbd-dev/lbd/bpf/lbxdp"
	"github.com/lbd-dev/lbd/daemon/maglev"
	"github.com/lbd-dev/lbd/internal/testnet"
	"golang.org/x/sys/unix"
)

// twoBackends is a table of backends 1 and 2 (IPv4, the service's port) at weight 1.
var twoBackends = map[uint32]uint32{id4(1): 1, id4(2): 1}

// TestTCPTranslatedBeforeFirstPacket: curl in the cgroup reaches the VIP; the very
// first SYN it causes is addressed to a backend, never to the VIP; an application sees
// VIP:80 as its peer.
func TestTCPTranslatedBeforeFirstPacket(t *testing.T) {
	testnet.Require(t, "curl")
	e := newEnv(t, 2)
	e.addBackends()
	e.service(lbxdp.ServiceKey{VIP: vipA, Port: portHTTP, Proto: lbxdp.ProtoTCP}, lbxdp.Service{ID: 1}, twoBackends)

	c := e.startCapture()
	out, err := e.command(e.cgroup, "curl", "-sS", "--max-time", "5", "http://"+vipA.String()+"/").CombinedOutput()
	if err != nil {
		t.Fatalf("curl http://%s/ in the cgroup: %v: %s", vipA, err, out)
	}
	name := strings.TrimSpace(string(out))
	if name != "be1" && name != "be2" {
		t.Fatalf("curl got %q, want a backend's name", out)
	}
	var syns []captured
	for _, p := range c.packets() {
		if p.Proto == lbxdp.ProtoTCP && p.Dst.Port() == portHTTP {
			syns = append(syns, p)
		}
	}
	if len(syns) == 0 {
		t.Fatal("no SYN captured in the client namespace")
	}
	for i, s := range syns {
		if s.Dst.Addr() == vipA {
			t.Errorf("SYN %d is addressed to the VIP %v", i, s.Dst)
		}
	}
	if got := e.byAddr[syns[0].Dst.Addr()]; got != name {
		t.Errorf("first SYN went to %v (%q), but %q answered", syns[0].Dst, got, name)
	}

	a := e.startAgent(e.cgroup)
	r := a.one(agentReq{Op: "tcp", Addr: ap(vipA, portHTTP), Send: "GET / HTTP/1.0\r\n\r\n", ReadAll: true})
	if r.Errno != 0 || r.Err != "" {
		t.Fatalf("connect: errno %d: %s", r.Errno, r.Err)
	}
	if want := ap(vipA, portHTTP); r.Peer != want {
		t.Errorf("getpeername() = %s, want %s", r.Peer, want)
	}
	if got := replyName(r.Reply); got != "be1" && got != "be2" {
		t.Errorf("HTTP reply %q, want a backend's name", r.Reply)
	}
	if s := e.stats(); s.Connect != 2 || s.Reverse < 1 || s.NoBackend != 0 {
		t.Errorf("stats %+v, want 2 connects, at least 1 reverse, no refusals", s)
	}
}

// TestUDP: unconnected (sendto/recvfrom) and connected sockets reach a UDP service;
// replies come from VIP:port as the application sees them; an unconnected socket
// keeps one backend for all its datagrams.
func TestUDP(t *testing.T) {
	e := newEnv(t, 3)
	e.addBackends()
	e.service(lbxdp.ServiceKey{VIP: vipA, Port: portUDP, Proto: lbxdp.ProtoUDP}, lbxdp.Service{ID: 1},
		map[uint32]uint32{id4(1): 1, id4(2): 1, id4(3): 1})
	a := e.startAgent(e.cgroup)
	want := ap(vipA, portUDP)

	t.Run("unconnected", func(t *testing.T) {
		c := e.startCapture()
		rs := a.do(agentReq{Op: "udp", Addr: want, N: 30, Send: "ping", Timeout: time.Second}).Results
		names := map[string]int{}
		for i, r := range rs {
			if r.Errno != 0 {
				t.Fatalf("datagram %d: errno %d: %s", i, r.Errno, r.Err)
			}
			if r.From != want {
				t.Errorf("datagram %d: recvfrom() source %s, want %s", i, r.From, want)
			}
			names[r.Reply]++
		}
		if len(names) != 1 {
			t.Errorf("one unconnected socket reached backends %v, want one", names)
		}
		for _, p := range c.packets() {
			if p.Proto == lbxdp.ProtoUDP && p.Dst.Addr() == vipA {
				t.Errorf("a datagram left addressed to the VIP: %v", p.Dst)
			}
		}
		// Other sockets draw their own backend: over 20 sockets, more than one.
		seen := map[string]bool{}
		for range 20 {
			r := a.one(agentReq{Op: "udp", Addr: want, Send: "ping", Timeout: time.Second})
			if r.Errno != 0 {
				t.Fatalf("errno %d: %s", r.Errno, r.Err)
			}
			seen[r.Reply] = true
		}
		if len(seen) < 2 {
			t.Errorf("20 sockets all reached %v: the backend is not chosen per socket", seen)
		}
	})
	t.Run("connected", func(t *testing.T) {
		for i := range 5 {
			rs := a.do(agentReq{Op: "udp", Addr: want, N: 3, Send: "ping", Connected: true, Timeout: time.Second}).Results
			for _, r := range rs {
				if r.Errno != 0 {
					t.Fatalf("socket %d: errno %d: %s", i, r.Errno, r.Err)
				}
				if r.From != want || r.Peer != want {
					t.Errorf("socket %d: recvfrom() source %s, getpeername() %s, want %s", i, r.From, r.Peer, want)
				}
				if r.Reply != rs[0].Reply {
					t.Errorf("socket %d: connected socket answered by %s and %s", i, rs[0].Reply, r.Reply)
				}
			}
		}
	})
	if s := e.stats(); s.Sendmsg != 50 || s.Connect != 5 || s.NoBackend != 0 {
		t.Errorf("stats %+v, want 50 unconnected sends, 5 connects, no refusals", s)
	}
}

// TestOutsideCgroupNotTranslated: a process of the same namespace outside the cgroup
// is left alone: its SYN goes to the VIP, where nobody answers. A process in a
// descendant cgroup is translated (attaching to a parent covers its subtree).
func TestOutsideCgroupNotTranslated(t *testing.T) {
	e := newEnv(t, 2)
	e.addBackends()
	e.service(lbxdp.ServiceKey{VIP: vipA, Port: portLine, Proto: lbxdp.ProtoTCP}, lbxdp.Service{ID: 1}, twoBackends)
	inside, outside := e.startAgent(e.cgroup), e.startAgent("")

	c := e.startCapture()
	r := outside.one(agentReq{Op: "tcp", Addr: ap(vipA, portLine), Timeout: 1500 * time.Millisecond})
	if r.Errno == 0 {
		t.Fatalf("a process outside the cgroup connected to the VIP (peer %s)", r.Peer)
	}
	if r.Dur < time.Second {
		t.Errorf("outside connect failed after %v (errno %d, %s): want it to wait for an answer that never comes", r.Dur, r.Errno, r.Err)
	}
	var toVIP bool
	for _, p := range c.packets() {
		if p.Proto == lbxdp.ProtoTCP && p.Dst == netip.AddrPortFrom(vipA, portLine) {
			toVIP = true
		} else if p.Proto == lbxdp.ProtoTCP && e.byAddr[p.Dst.Addr()] != "" {
			t.Errorf("SYN to a backend %v from outside the cgroup", p.Dst)
		}
	}
	if !toVIP {
		t.Error("no SYN addressed to the VIP captured")
	}
	if got := inside.lineOnce(ap(vipA, portLine)); got.Peer != ap(vipA, portLine) {
		t.Errorf("inside the cgroup: peer %s, want the VIP", got.Peer)
	}
	nested := e.startAgent(newCgroup(t, e.cgroup, "child"))
	if got := nested.lineOnce(ap(vipA, portLine)); got.Peer != ap(vipA, portLine) {
		t.Errorf("in a child cgroup: peer %s, want the VIP", got.Peer)
	}
	if s := e.stats(); s.Connect != 2 {
		t.Errorf("stats %+v, want exactly the inside and child connects translated", s)
	}
}

// TestDrain: the table is rebuilt without backend X (which stays in the backend map,
// as the daemon drains): a connection established to X keeps exchanging data; new
// connections never reach X.
func TestDrain(t *testing.T) {
	e := newEnv(t, 3)
	e.addBackends()
	all := map[uint32]uint32{id4(1): 1, id4(2): 1, id4(3): 1}
	e.service(lbxdp.ServiceKey{VIP: vipA, Port: portLine, Proto: lbxdp.ProtoTCP}, lbxdp.Service{ID: 1}, all)
	a := e.startAgent(e.cgroup)

	held := a.one(agentReq{Op: "tcp", Addr: ap(vipA, portLine), Send: "hello\n", Hold: true})
	if held.Errno != 0 || held.Err != "" {
		t.Fatalf("connect: errno %d: %s", held.Errno, held.Err)
	}
	x := replyName(held.Reply)
	var xID uint32
	for i, b := range e.backends {
		if b.name == x {
			xID = id4(i + 1)
		}
	}
	if xID == 0 {
		t.Fatalf("reply %q names no backend", held.Reply)
	}
	delete(all, xID)
	e.table(1, all)

	for i := range 5 {
		r := a.one(agentReq{Op: "send", ID: held.ID, Send: fmt.Sprintf("line %d\n", i)})
		if r.Err != "" || replyName(r.Reply) != x {
			t.Fatalf("established connection after the drain, line %d: reply %q, err %q, want %s", i, r.Reply, r.Err, x)
		}
	}
	for i := range 50 {
		if got := a.lineOnce(ap(vipA, portLine)); got.Reply == x {
			t.Fatalf("new connection %d reached the drained backend %s", i, x)
		}
	}
	r := a.one(agentReq{Op: "send", ID: held.ID, Send: "last\n"})
	if r.Err != "" || replyName(r.Reply) != x {
		t.Errorf("established connection at the end: reply %q, err %q", r.Reply, r.Err)
	}
}

// TestNoBackendRefused: a service without a usable backend fails connect() at once
// with ECONNREFUSED (no SYN timeout), and UDP sends too; NoBackend counts them.
func TestNoBackendRefused(t *testing.T) {
	e := newEnv(t, 2)
	e.addBackends()
	tcp := lbxdp.ServiceKey{VIP: vipA, Port: portLine, Proto: lbxdp.ProtoTCP}
	udp := lbxdp.ServiceKey{VIP: vipA, Port: portUDP, Proto: lbxdp.ProtoUDP}
	e.service(tcp, lbxdp.Service{ID: 1}, nil)
	e.service(udp, lbxdp.Service{ID: 2}, nil)
	a := e.startAgent(e.cgroup)
	refusals := uint64(0)

	refused := func(t *testing.T, n int) []time.Duration {
		t.Helper()
		// One probe first: a connect() that is not refused waits for its timeout.
		probe := a.one(agentReq{Op: "tcp", Addr: ap(vipA, portLine), Timeout: 500 * time.Millisecond})
		if probe.Errno != int(unix.ECONNREFUSED) {
			t.Fatalf("connect: errno %d (%s) after %v, want ECONNREFUSED", probe.Errno, probe.Err, probe.Dur)
		}
		rs := a.do(agentReq{Op: "tcp", Addr: ap(vipA, portLine), N: n, Timeout: 500 * time.Millisecond}).Results
		var durs []time.Duration
		for i, r := range rs {
			if r.Errno != int(unix.ECONNREFUSED) {
				t.Fatalf("connect %d: errno %d (%s), want ECONNREFUSED", i, r.Errno, r.Err)
			}
			durs = append(durs, r.Dur)
		}
		refusals += uint64(n) + 1
		slices.Sort(durs)
		if max := durs[len(durs)-1]; max > 100*time.Millisecond {
			t.Errorf("slowest refused connect() took %v: it waited for the network", max)
		}
		return durs
	}

	t.Run("no table", func(t *testing.T) {
		durs := refused(t, 100)
		t.Logf("ECONNREFUSED connect() over %d tries: median %v, max %v", len(durs), durs[len(durs)/2], durs[len(durs)-1])

		for _, connected := range []bool{false, true} {
			r := a.one(agentReq{Op: "udp", Addr: ap(vipA, portUDP), Send: "ping", Connected: connected, Timeout: time.Second})
			if r.Errno != int(unix.ECONNREFUSED) {
				t.Errorf("UDP (connected %v): errno %d (%s), want ECONNREFUSED", connected, r.Errno, r.Err)
			}
			refusals++
		}
	})
	t.Run("table deleted", func(t *testing.T) {
		e.table(1, twoBackends)
		a.lineOnce(ap(vipA, portLine))
		if err := e.lb.DeleteMaglevTable(1); err != nil {
			t.Fatal(err)
		}
		refused(t, 10)
	})
	t.Run("table of deleted backends", func(t *testing.T) {
		e.table(1, twoBackends)
		for _, id := range []uint32{id4(1), id4(2)} {
			if err := e.lb.DeleteBackend(id); err != nil {
				t.Fatal(err)
			}
		}
		refused(t, 10)
	})
	if s := e.stats(); s.NoBackend != refusals || s.Connect != 1 {
		t.Errorf("stats %+v, want %d refusals and 1 connect", s, refusals)
	}
}

// TestIPv6: an IPv6 VIP with IPv6 backends, and an IPv4 VIP reached from a
// dual-stack AF_INET6 socket as ::ffff:VIP.
func TestIPv6(t *testing.T) {
	e := newEnv(t, 2)
	e.addBackends()
	e.service(lbxdp.ServiceKey{VIP: vip6, Port: portHTTP, Proto: lbxdp.ProtoTCP}, lbxdp.Service{ID: 1},
		map[uint32]uint32{id6(1): 1, id6(2): 1})
	e.service(lbxdp.ServiceKey{VIP: vipA, Port: portHTTP, Proto: lbxdp.ProtoTCP}, lbxdp.Service{ID: 2}, twoBackends)
	e.service(lbxdp.ServiceKey{VIP: vip6, Port: portUDP, Proto: lbxdp.ProtoUDP}, lbxdp.Service{ID: 3},
		map[uint32]uint32{id6(1): 1, id6(2): 1})
	e.service(lbxdp.ServiceKey{VIP: vipA, Port: portUDP, Proto: lbxdp.ProtoUDP}, lbxdp.Service{ID: 4}, twoBackends)
	a := e.startAgent(e.cgroup)
	get := "GET / HTTP/1.0\r\n\r\n"

	c := e.startCapture()
	r := a.one(agentReq{Op: "tcp", Addr: ap(vip6, portHTTP), Send: get, ReadAll: true})
	if r.Errno != 0 || r.Err != "" {
		t.Fatalf("IPv6 VIP: errno %d: %s", r.Errno, r.Err)
	}
	if want := ap(vip6, portHTTP); r.Peer != want {
		t.Errorf("IPv6 VIP: getpeername() = %s, want %s", r.Peer, want)
	}
	if n := replyName(r.Reply); n != "be1" && n != "be2" {
		t.Errorf("IPv6 VIP: reply %q", r.Reply)
	}
	syns := 0
	for _, p := range c.packets() {
		if p.Proto == lbxdp.ProtoTCP && p.Dst.Port() == portHTTP {
			syns++
			if !p.Dst.Addr().Is6() || e.byAddr[p.Dst.Addr()] == "" {
				t.Errorf("IPv6 VIP: SYN to %v, want an IPv6 backend", p.Dst)
			}
		}
	}
	if syns == 0 {
		t.Error("IPv6 VIP: no SYN captured")
	}

	u := a.one(agentReq{Op: "udp", Addr: ap(vip6, portUDP), Send: "ping", Timeout: time.Second})
	if u.Errno != 0 || u.From != ap(vip6, portUDP) {
		t.Errorf("IPv6 UDP: errno %d (%s), source %s, want %s", u.Errno, u.Err, u.From, ap(vip6, portUDP))
	}

	mapped := netip.AddrFrom16(vipA.As16())
	r = a.one(agentReq{Op: "tcp", Addr: ap(vipA, portHTTP), Mapped: true, Send: get, ReadAll: true})
	if r.Errno != 0 || r.Err != "" {
		t.Fatalf("::ffff:VIP: errno %d: %s", r.Errno, r.Err)
	}
	if want := ap(mapped, portHTTP); r.Peer != want {
		t.Errorf("::ffff:VIP: getpeername() = %s, want %s", r.Peer, want)
	}
	if n := replyName(r.Reply); n != "be1" && n != "be2" {
		t.Errorf("::ffff:VIP: reply %q", r.Reply)
	}
	for _, connected := range []bool{false, true} {
		u = a.one(agentReq{Op: "udp", Addr: ap(vipA, portUDP), Mapped: true, Send: "ping", Connected: connected, Timeout: time.Second})
		if want := ap(mapped, portUDP); u.Errno != 0 || u.From != want {
			t.Errorf("::ffff:VIP UDP (connected %v): errno %d (%s), source %s, want %s", connected, u.Errno, u.Err, u.From, want)
		}
	}
}

// TestPorts: a service on all ports keeps the destination port; a backend port
// different from the service port is used while the application sees the service's.
func TestPorts(t *testing.T) {
	e := newEnv(t, 2)
	e.addBackends()
	e.service(lbxdp.ServiceKey{VIP: vipC, Port: 0, Proto: lbxdp.ProtoTCP}, lbxdp.Service{ID: 1}, twoBackends)
	e.service(lbxdp.ServiceKey{VIP: vipB, Port: 8080, Proto: lbxdp.ProtoTCP}, lbxdp.Service{ID: 2},
		map[uint32]uint32{id4p80(1): 1, id4p80(2): 1})
	a := e.startAgent(e.cgroup)
	get := "GET / HTTP/1.0\r\n\r\n"

	for _, port := range []uint16{portHTTP, portLine} {
		send := get
		if port == portLine {
			send = "hello\n"
		}
		r := a.one(agentReq{Op: "tcp", Addr: ap(vipC, port), Send: send, ReadAll: port == portHTTP})
		if r.Errno != 0 || r.Err != "" {
			t.Fatalf("wildcard service, port %d: errno %d: %s", port, r.Errno, r.Err)
		}
		if r.Peer != ap(vipC, port) {
			t.Errorf("wildcard service: getpeername() = %s, want %s", r.Peer, ap(vipC, port))
		}
		if n := replyName(r.Reply); n != "be1" && n != "be2" {
			t.Errorf("wildcard service, port %d: reply %q", port, r.Reply)
		}
	}
	// No UDP service on vipC: a datagram is left alone (and goes nowhere).
	if u := a.one(agentReq{Op: "udp", Addr: ap(vipC, portUDP), Send: "ping", Timeout: 300 * time.Millisecond}); u.Errno == 0 {
		t.Errorf("UDP to a TCP-only wildcard VIP got a reply from %s", u.From)
	}

	r := a.one(agentReq{Op: "tcp", Addr: ap(vipB, 8080), Send: get, ReadAll: true})
	if r.Errno != 0 || r.Err != "" {
		t.Fatalf("service port 8080 → backend port 80: errno %d: %s", r.Errno, r.Err)
	}
	if r.Peer != ap(vipB, 8080) {
		t.Errorf("getpeername() = %s, want %s", r.Peer, ap(vipB, 8080))
	}
	if n := replyName(r.Reply); n != "be1" && n != "be2" {
		t.Errorf("service port 8080: reply %q", r.Reply)
	}
	tr, err := e.sock.Translations()
	if err != nil {
		t.Fatal(err)
	}
	if len(tr) != 0 {
		t.Errorf("translations left after every socket closed: %+v", tr)
	}
}

// TestWeights: backends weighted 3:1 share new connections about 3:1.
func TestWeights(t *testing.T) {
	e := newEnv(t, 2)
	e.addBackends()
	table := e.table(1, map[uint32]uint32{id4(1): 3, id4(2): 1})
	if err := e.lb.UpsertService(lbxdp.ServiceKey{VIP: vipA, Port: portLine, Proto: lbxdp.ProtoTCP}, lbxdp.Service{ID: 1}); err != nil {
		t.Fatal(err)
	}
	a := e.startAgent(e.cgroup)

	const n = 400
	rs := a.do(agentReq{Op: "tcp", Addr: ap(vipA, portLine), N: n, Send: "hello\n"}).Results
	count := map[string]int{}
	for i, r := range rs {
		if r.Errno != 0 || r.Err != "" {
			t.Fatalf("connect %d: errno %d: %s", i, r.Errno, r.Err)
		}
		count[replyName(r.Reply)]++
	}
	// Each connect draws a random slot: be1's count is binomial with p = its share
	// of the table (about 3/4). Five standard deviations make a false failure
	// vanishingly rare while a 1:1 or 1:3 split still fails.
	p := float64(maglev.Shares(table)[id4(1)]) / float64(len(table))
	want := p * n
	sd := math.Sqrt(n * p * (1 - p))
	t.Logf("split over %d connects: be1 %d, be2 %d (table share of be1 %.3f, expected %.0f ± %.0f)", n, count["be1"], count["be2"], p, want, sd)
	if count["be1"]+count["be2"] != n {
		t.Fatalf("answers %v, want only be1 and be2", count)
	}
	if math.Abs(float64(count["be1"])-want) > 5*sd {
		t.Errorf("be1 got %d of %d connects, want %.0f ± %.0f", count["be1"], n, want, 5*sd)
	}
}

// TestAffinity: with session affinity every connect of the namespace goes to one
// backend; once the backend leaves the table and its affinity entries are purged,
// the next connect goes elsewhere, and sticks there.
func TestAffinity(t *testing.T) {
	e := newEnv(t, 3)
	e.addBackends()
	all := map[uint32]uint32{id4(1): 1, id4(2): 1, id4(3): 1}
	e.service(lbxdp.ServiceKey{VIP: vipA, Port: portLine, Proto: lbxdp.ProtoTCP},
		lbxdp.Service{ID: 1, AffinityTimeout: time.Minute}, all)
	a := e.startAgent(e.cgroup)

	first := a.lineOnce(ap(vipA, portLine)).Reply
	for i := range 30 {
		if got := a.lineOnce(ap(vipA, portLine)).Reply; got != first {
			t.Fatalf("connect %d went to %s, affinity said %s", i, got, first)
		}
	}
	var xID uint32
	for i, b := range e.backends {
		if b.name == first {
			xID = id4(i + 1)
		}
	}
	delete(all, xID)
	e.table(1, all)
	n, err := e.sock.PurgeAffinity(func(svc, id uint32) bool { return svc == 1 && id == xID })
	if err != nil {
		t.Fatal(err)
	}
	if n != 1 {
		t.Errorf("PurgeAffinity deleted %d entries, want 1 (one namespace)", n)
	}
	next := a.lineOnce(ap(vipA, portLine)).Reply
	if next == first {
		t.Fatalf("after the purge a new connect still went to %s", first)
	}
	for i := range 10 {
		if got := a.lineOnce(ap(vipA, portLine)).Reply; got != next {
			t.Fatalf("connect %d after the purge went to %s, want the new affinity %s", i, got, next)
		}
	}
}

// TestStatsAndTranslations: an open connection is listed with its cookie, service
// and backend; closing the socket removes it; the counters count what happened.
func TestStatsAndTranslations(t *testing.T) {
	e := newEnv(t, 2)
	e.addBackends()
	svc := lbxdp.ServiceKey{VIP: vipA, Port: portLine, Proto: lbxdp.ProtoTCP}
	e.service(svc, lbxdp.Service{ID: 7}, twoBackends)
	a := e.startAgent(e.cgroup)

	before := lbxdp.MonotonicNow()
	held := a.one(agentReq{Op: "tcp", Addr: ap(vipA, portLine), Send: "hello\n", Hold: true})
	if held.Errno != 0 || held.Err != "" || held.Cookie == 0 {
		t.Fatalf("connect: errno %d: %s (cookie %d)", held.Errno, held.Err, held.Cookie)
	}
	name := replyName(held.Reply)
	var wantBackend netip.AddrPort
	var wantID uint32
	for i, b := range e.backends {
		if b.name == name {
			wantBackend, wantID = netip.AddrPortFrom(b.addr4, portLine), id4(i+1)
		}
	}
	tr, err := e.sock.Translations()
	if err != nil {
		t.Fatal(err)
	}
	var found *Translation
	for i := range tr {
		if tr[i].Cookie == held.Cookie {
			found = &tr[i]
		}
	}
	if found == nil {
		t.Fatalf("no translation for cookie %d in %+v", held.Cookie, tr)
	}
	want := Translation{Cookie: held.Cookie, Proto: lbxdp.ProtoTCP, Service: netip.AddrPortFrom(vipA, portLine),
		Backend: wantBackend, ServiceID: 7, BackendID: wantID, Created: found.Created}
	if *found != want {
		t.Errorf("translation %+v, want %+v", *found, want)
	}
	if found.Created < before {
		t.Errorf("translation created at %v, before the connect (%v)", found.Created, before)
	}
	s := e.stats()
	// Reverse: the agent's getpeername(), and Go's net.FileConn asks once more.
	if s.Connect != 1 || s.Reverse < 1 || s.Sendmsg != 0 || s.NoBackend != 0 || s.RevNATFull != 0 {
		t.Errorf("stats %+v, want 1 connect, a reverse translation (getpeername), nothing else", s)
	}

	a.do(agentReq{Op: "close", ID: held.ID})
	deadline := time.Now().Add(2 * time.Second)
	for {
		tr, err := e.sock.Translations()
		if err != nil {
			t.Fatal(err)
		}
		if !slices.ContainsFunc(tr, func(x Translation) bool { return x.Cookie == held.Cookie }) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("translation of cookie %d still listed after close: %+v", held.Cookie, tr)
		}
		time.Sleep(20 * time.Millisecond)
	}

	u := a.one(agentReq{Op: "udp", Addr: ap(vipA, portUDP), Send: "ping", Timeout: 300 * time.Millisecond})
	if u.Errno == 0 {
		t.Errorf("UDP to a VIP without a UDP service got a reply from %s", u.From)
	}
	if s := e.stats(); s.Connect != 1 || s.Sendmsg != 0 {
		t.Errorf("stats after a UDP send to no service %+v, want it untranslated", s)
	}
}

// TestFailedConnectLeavesNoTranslation: a blocking connect() that the backend refuses
// leaves the socket without a peer (the kernel disconnects it); closing the socket
// must still remove its reverse entry. Likewise a connected UDP socket that connects
// to another service leaves no entry for its first backend behind.
func TestFailedConnectLeavesNoTranslation(t *testing.T) {
	e := newEnv(t, 2)
	e.addBackends()
	// All ports: the backends refuse every port but their servers'.
	e.service(lbxdp.ServiceKey{VIP: vipC, Port: 0, Proto: lbxdp.ProtoTCP}, lbxdp.Service{ID: 1}, twoBackends)
	// One backend each, so that the UDP socket's second connect() changes backend.
	e.service(lbxdp.ServiceKey{VIP: vipA, Port: portUDP, Proto: lbxdp.ProtoUDP}, lbxdp.Service{ID: 2}, map[uint32]uint32{id4(1): 1})
	e.service(lbxdp.ServiceKey{VIP: vipB, Port: portUDP, Proto: lbxdp.ProtoUDP}, lbxdp.Service{ID: 3}, map[uint32]uint32{id4(2): 1})
	a := e.startAgent(e.cgroup)

	for _, blocking := range []bool{true, false} {
		r := a.one(agentReq{Op: "tcp", Addr: ap(vipC, 7001), Blocking: blocking})
		if r.Errno != int(unix.ECONNREFUSED) {
			t.Fatalf("connect (blocking %v) to a port the backend refuses: errno %d (%s), want ECONNREFUSED", blocking, r.Errno, r.Err)
		}
	}
	if got := a.lineOnce(ap(vipC, portLine)); got.Peer != ap(vipC, portLine) {
		t.Errorf("blocking connect: getpeername() = %s", got.Peer)
	}
	rs := a.do(agentReq{Op: "udp", Addr: ap(vipA, portUDP), Connected: true, Reconnect: ap(vipB, portUDP), Send: "ping", Timeout: time.Second}).Results
	if len(rs) != 2 {
		t.Fatalf("UDP reconnect: results %+v", rs)
	}
	for i, want := range []string{ap(vipA, portUDP), ap(vipB, portUDP)} {
		if rs[i].Errno != 0 || rs[i].From != want || rs[i].Peer != want {
			t.Errorf("UDP datagram %d: errno %d (%s), source %s, peer %s, want %s", i, rs[i].Errno, rs[i].Err, rs[i].From, rs[i].Peer, want)
		}
	}
	if s := e.stats(); s.Connect != 5 {
		t.Errorf("stats %+v, want 5 translated connects", s)
	}
	tr, err := e.sock.Translations()
	if err != nil {
		t.Fatal(err)
	}
	if len(tr) != 0 {
		t.Errorf("translations of closed sockets left behind: %+v", tr)
	}
}
