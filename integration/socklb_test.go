//go:build linux

package integration

import (
	"bytes"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
	"github.com/lbd-dev/lbd/daemon/datapath"
	"github.com/lbd-dev/lbd/internal/testnet"
	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
)

// setupCgroup creates the testbed's cgroup v2 directory for socket-level load
// balancing. It is removed at the end, after every process the test started in it has
// been killed (their cleanups run first).
func (tb *testbed) setupCgroup() {
	t := tb.t
	root, err := datapath.CgroupRoot()
	if err != nil {
		t.Fatal(err)
	}
	tb.cgroup = filepath.Join(root, "lbd-it-"+tb.sfx)
	if err := os.Mkdir(tb.cgroup, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// A process may take a moment to leave the cgroup after it was reaped.
		deadline := time.Now().Add(5 * time.Second)
		for {
			err := os.Remove(tb.cgroup)
			if err == nil || errors.Is(err, os.ErrNotExist) {
				return
			}
			if time.Now().After(deadline) {
				t.Errorf("remove cgroup %s: %v", tb.cgroup, err)
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
	})
}

// runIn runs a command to completion in namespace ns and, if cgroup is set, inside
// that cgroup; it returns stdout, stderr and the error.
func runIn(t *testing.T, ns *testnet.NS, cgroup string, timeout time.Duration, argv ...string) (string, string, error) {
	cmd := ns.Command(append([]string{"timeout", fmt.Sprint(timeout.Seconds())}, argv...)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if cgroup != "" {
		testnet.InCgroup(t, cmd, cgroup)
	}
	err := cmd.Run()
	return stdout.String(), stderr.String(), err
}

// TestSocketLB: lbd on a backend node with socket-level load balancing. A process in
// the configured cgroup reaches a VIP straight at a backend — its first SYN already
// goes to the backend's address, no packet goes to the VIP (no hairpin through the
// router and an LB node) —, a process outside the cgroup is not translated, lbctl
// lists the translated sockets and counts them, draining a backend keeps established
// connections and steers new ones away, and a service without backends refuses
// connect() at once.
func TestSocketLB(t *testing.T) {
	t.Parallel()
	tb := newTestbed(t, options{socketLB: true})
	tb.startLBD()
	be1 := tb.backends[0]
	d := be1.lbd
	// The backend node's lbd needs the services too: socket-level load balancing
	// programs what this node's API holds.
	for _, s := range tb.defaultServices() {
		args := []string{"service", "create", s.name, "--vip", s.vip.String(), "--port", fmt.Sprint(s.port), "--protocol", s.proto}
		for _, b := range s.backends {
			args = append(args, "--backend", b)
		}
		d.lbctl(t, args...)
	}
	eventually(t, 10*time.Second, func() error {
		var svc lbdv1.Service
		d.lbctlJSON(t, &svc, "service", "get", "web")
		if st := svc.GetStatus().GetState(); st != lbdv1.ServiceState_SERVICE_STATE_READY {
			return fmt.Errorf("web on %s: %v %s", be1.name, st, svc.GetStatus().GetReason())
		}
		return nil
	})
	web := netip.AddrPortFrom(vip4, webPort)
	backendAddrs := map[string]bool{}
	for _, be := range tb.backends {
		backendAddrs[be.addr4.String()] = true
	}

	t.Run("first SYN goes to a backend", func(t *testing.T) {
		caps := be1.synCaptures(t)
		answered := map[string]int{}
		for i := 0; i < 12; i++ {
			out, errOut, err := runIn(t, be1.ns, tb.cgroup, 5*time.Second, "curl", "-sS", "--max-time", "3", "http://"+web.String()+"/")
			if err != nil {
				t.Fatalf("curl %s in the cgroup: %v: %s", web, err, errOut)
			}
			answered[strings.Fields(out + " -")[0]]++
		}
		// getpeername() of the application's socket says VIP:80.
		out, errOut, err := runIn(t, be1.ns, tb.cgroup, 5*time.Second, "python3", "-c", pyPeer, vip4.String(), fmt.Sprint(webPort))
		if err != nil || strings.TrimSpace(out) != fmt.Sprintf("%s %d", vip4, webPort) {
			t.Errorf("getpeername() in the cgroup: %q, %v: %s", out, err, errOut)
		}
		syns := synDestinations(caps)
		for _, dst := range syns {
			if dst.Addr() == vip4 || !backendAddrs[dst.Addr().String()] || dst.Port() != httpPort {
				t.Errorf("a SYN went to %s, not to a backend's HTTP port", dst)
			}
		}
		if len(syns) < 13 {
			t.Errorf("captured %d SYNs for 13 connections: %v", len(syns), syns)
		}
		t.Logf("12 requests in the cgroup answered by %v; %d SYNs captured, all to backend addresses; getpeername() = %s",
			answered, len(syns), strings.TrimSpace(out))
		if len(answered) < 2 {
			t.Errorf("12 connections all reached %v: the backend is not chosen per connection", answered)
		}
	})

	t.Run("outside the cgroup is not translated", func(t *testing.T) {
		caps := be1.synCaptures(t)
		// Whether the VIP answers a backend node the long way round does not matter here:
		// only where the SYN goes.
		runIn(t, be1.ns, "", 3*time.Second, "curl", "-sS", "--max-time", "1", "http://"+web.String()+"/")
		syns := synDestinations(caps)
		if len(syns) == 0 || syns[0] != web {
			t.Errorf("outside the cgroup, the SYNs went to %v, want %s", syns, web)
		}
	})

	t.Run("lbctl lists, restart and drain keep established, new avoid", func(t *testing.T) {
		// A long-lived connection from the cgroup to the stream service.
		nc := tb.spawnIn("nc-socklb", be1.ns, tb.cgroup, nil, "sh", "-c",
			fmt.Sprintf("i=0; while [ $i -lt 600 ]; do echo ping$i; i=$((i+1)); sleep 0.05; done | nc %s %d", vip4, streamPt))
		var pinned string
		eventually(t, 5*time.Second, func() error {
			var resp lbdv1.ListSocketTranslationsResponse
			d.lbctlJSON(t, &resp, "socket", "list", "--vip", vip4.String())
			for _, tr := range resp.GetTranslations() {
				if tr.GetServiceName() == "stream" && tr.GetVipPort() == streamPt && tr.GetProtocol() == lbdv1.Protocol_PROTOCOL_TCP {
					pinned = tr.GetBackendAddress()
					return nil
				}
			}
			return fmt.Errorf("no stream socket listed: %v", &resp)
		})
		if !backendAddrs[pinned] || tb.byAddr(pinned) == nil {
			t.Fatalf("stream socket translated to %q, not a backend", pinned)
		}
		nc.WaitLog(t, tb.byAddr(pinned).name+" ping5", 5*time.Second)
		t.Logf("lbctl socket list: the stream socket goes to %s", pinned)
		t.Logf("%s", d.lbctl(t, "socket", "list"))

		// A SIGKILLed and restarted lbd adopts the hooks and their maps: the socket stays
		// listed, and its entry still goes when it closes (below).
		d.crash()
		d.start(t)
		var again lbdv1.ListSocketTranslationsResponse
		d.lbctlJSON(t, &again, "socket", "list", "--backend", pinned)
		if !slices.ContainsFunc(again.GetTranslations(), func(tr *lbdv1.SocketTranslation) bool { return tr.GetServiceName() == "stream" }) {
			t.Fatalf("after a restart the stream socket is no longer listed: %v", &again)
		}

		d.lbctl(t, "backend", "drain", "stream", netip.AddrPortFrom(netip.MustParseAddr(pinned), echoPort).String())
		time.Sleep(300 * time.Millisecond) // the reconciler writes the new table
		out, errOut, err := runIn(t, be1.ns, tb.cgroup, 20*time.Second, "python3", "-c", pyEcho, vip4.String(), fmt.Sprint(streamPt), "30")
		if err != nil {
			t.Fatalf("new connections to the stream service: %v: %s", err, errOut)
		}
		got := map[string]int{}
		for _, name := range strings.Fields(out) {
			got[name]++
		}
		if got[tb.byAddr(pinned).name] > 0 || len(strings.Fields(out)) != 30 {
			t.Errorf("30 new connections after draining %s reached %v", tb.byAddr(pinned).name, got)
		}
		t.Logf("30 new connections after draining %s: %v", tb.byAddr(pinned).name, got)
		// The established connection still gets answers from the drained backend.
		nc.WaitLog(t, tb.byAddr(pinned).name+" ping40", 10*time.Second)
		nc.Kill()
		eventually(t, 5*time.Second, func() error {
			var resp lbdv1.ListSocketTranslationsResponse
			d.lbctlJSON(t, &resp, "socket", "list", "--backend", pinned)
			for _, tr := range resp.GetTranslations() {
				if tr.GetServiceName() == "stream" {
					return fmt.Errorf("closed stream socket still listed: %v", tr)
				}
			}
			return nil
		})
	})

	t.Run("UDP unconnected and connected", func(t *testing.T) {
		dns := netip.AddrPortFrom(vip4, dnsPort)
		out, errOut, err := runIn(t, be1.ns, tb.cgroup, 10*time.Second, "python3", "-c", pyUDP, vip4.String(), fmt.Sprint(dnsPort), "5")
		if err != nil {
			t.Fatalf("UDP client in the cgroup: %v: %s", err, errOut)
		}
		lines := strings.Split(strings.TrimSpace(out), "\n")
		if len(lines) != 11 {
			t.Fatalf("UDP client printed %q, want 5 unconnected answers, 5 connected ones and getpeername", out)
		}
		unconnected := map[string]bool{}
		for i, line := range lines[:10] {
			// "<source as the application sees it> <node that answered>"
			f := strings.Fields(line)
			if len(f) != 2 || f[0] != dns.String() || tb.byName(f[1]) == nil {
				t.Errorf("datagram %d: %q, want an answer from %s by a backend", i, line, dns)
				continue
			}
			if i < 5 {
				unconnected[f[1]] = true
			}
		}
		if len(unconnected) != 1 {
			t.Errorf("one unconnected socket's datagrams reached %v: want one backend", unconnected)
		}
		if lines[10] != "peer "+dns.String() {
			t.Errorf("getpeername() of the connected UDP socket: %q, want %s", lines[10], dns)
		}
	})

	t.Run("no backend refuses at once", func(t *testing.T) {
		d.lbctl(t, "service", "create", "empty", "--vip", vip4.String(), "--port", "7777", "--protocol", "tcp")
		time.Sleep(300 * time.Millisecond)
		// The client measures connect() itself and prints the errno's name and the
		// microseconds it took.
		out, errOut, err := runIn(t, be1.ns, tb.cgroup, 10*time.Second, "python3", "-c", pyRefused, vip4.String(), "7777", "20")
		if err != nil {
			t.Fatalf("connect to a service without backends: %v: %s", err, errOut)
		}
		var us []int
		for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
			var name string
			var v int
			if _, err := fmt.Sscan(line, &name, &v); err != nil || name != "ECONNREFUSED" {
				t.Fatalf("connect to a service without backends: %q, want ECONNREFUSED", line)
			}
			us = append(us, v)
		}
		slices.Sort(us)
		if len(us) != 20 {
			t.Fatalf("%d results for 20 connects: %q", len(us), out)
		}
		// A SYN timeout would take a second or more; the refusal comes from the hook.
		if us[len(us)-1] > 100_000 {
			t.Errorf("a refused connect() took %d µs", us[len(us)-1])
		}
		t.Logf("connect() to a service without backends: ECONNREFUSED ×20, median %d µs, max %d µs", us[len(us)/2], us[len(us)-1])
	})

	t.Run("counters", func(t *testing.T) {
		var st lbdv1.GetStatsResponse
		d.lbctlJSON(t, &st, "stats")
		got := map[string]uint64{}
		for _, e := range st.GetSocketEvents() {
			got[e.GetName()] = e.GetCount()
		}
		if got["connect"] < 35 || got["sendmsg"] < 5 || got["no_backend"] < 20 || got["reverse"] < 10 {
			t.Errorf("socket counters %v: want ≥ 35 connects, ≥ 5 sends, ≥ 20 refusals, ≥ 10 reverse translations", got)
		}
		metrics := be1.ns.Exec(t, "curl", "-sS", "http://"+metricsAddr+"/metrics")
		if !strings.Contains(metrics, `lbd_socket_lb_calls_total{event="connect"}`) {
			t.Errorf("metrics lack lbd_socket_lb_calls_total{event=\"connect\"}")
		}
	})
}

// byAddr returns the backend node with IPv4 address addr, nil if none.
func (tb *testbed) byAddr(addr string) *node {
	for _, be := range tb.backends {
		if be.addr4.String() == addr {
			return be
		}
	}
	return nil
}

// pyPeer connects to argv[1]:argv[2] and prints getpeername().
const pyPeer = `import socket, sys
s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=3)
print(*s.getpeername()[:2])`

// pyRefused connects argv[3] times to argv[1]:argv[2] and prints, per attempt, the
// errno's name (OK if it connected) and how long connect() took in microseconds.
const pyRefused = `import errno, socket, sys, time
for _ in range(int(sys.argv[3])):
    s = socket.socket()
    s.settimeout(3)
    t = time.perf_counter()
    try:
        s.connect((sys.argv[1], int(sys.argv[2])))
        name = "OK"
    except OSError as e:
        name = errno.errorcode.get(e.errno, str(e))
    print(name, int((time.perf_counter() - t) * 1e6))
    s.close()`

// synCaptures captures on the node's uplink and loopback (a backend may be the node
// itself) until synDestinations stops them.
func (n *node) synCaptures(t *testing.T) []*testnet.Capture {
	return []*testnet.Capture{n.ns.Capture(t, n.ifc), n.ns.Capture(t, "lo")}
}

// synDestinations stops the captures and returns where their connection-opening SYNs
// (SYN without ACK) went, in capture order per interface.
func synDestinations(caps []*testnet.Capture) []netip.AddrPort {
	var out []netip.AddrPort
	for _, c := range caps {
		for _, fr := range c.Stop() {
			// Only what the node sends (loopback shows each frame twice). Loopback frames
			// carry an all-zero Ethernet header, so both decode alike.
			pkt := gopacket.NewPacket(fr.Data, layers.LayerTypeEthernet, gopacket.DecodeOptions{Lazy: true, NoCopy: true})
			tcp, _ := pkt.Layer(layers.LayerTypeTCP).(*layers.TCP)
			nl := pkt.NetworkLayer()
			if tcp == nil || nl == nil || !tcp.SYN || tcp.ACK || !fr.Outgoing {
				continue
			}
			dst, _ := netip.AddrFromSlice(nl.NetworkFlow().Dst().Raw())
			out = append(out, netip.AddrPortFrom(dst.Unmap(), uint16(tcp.DstPort)))
		}
	}
	return out
}

// pyEcho opens argv[3] connections to the echo service at argv[1]:argv[2] and prints,
// for each, the name of the node that answered.
const pyEcho = `import socket, sys
for _ in range(int(sys.argv[3])):
    s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=3)
    s.sendall(b"x\n")
    print(s.makefile().readline().split()[0])
    s.close()`

// pyUDP sends argv[3] datagrams from one unconnected socket to argv[1]:argv[2], then
// argv[3] from one connected socket, printing for each answer the source the
// application sees and the answering node; then the connected socket's getpeername().
const pyUDP = `import socket, sys
dst = (sys.argv[1], int(sys.argv[2]))
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
u.settimeout(3)
for i in range(int(sys.argv[3])):
    u.sendto(b"u%d" % i, dst)
    data, src = u.recvfrom(2048)
    print("%s:%d" % src, data.split()[0].decode())
c = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
c.settimeout(3)
c.connect(dst)
for i in range(int(sys.argv[3])):
    c.send(b"c%d" % i)
    data, src = c.recvfrom(2048)
    print("%s:%d" % src, data.split()[0].decode())
print("peer %s:%d" % c.getpeername())`

// byName returns the backend node called name, nil if none.
func (tb *testbed) byName(name string) *node {
	for _, be := range tb.backends {
		if be.name == name {
			return be
		}
	}
	return nil
}
