//go:build linux

package socklb

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
	"github.com/lbd-dev/lbd/bpf/lbxdp"
	"github.com/lbd-dev/lbd/daemon/maglev"
	"github.com/lbd-dev/lbd/internal/nsdo"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

func TestMain(m *testing.M) {
	if os.Getenv(agentEnv) != "" {
		runAgent()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// Ports the backends serve on every address.
const (
	portHTTP = 80   // HTTP: answers with the backend's name
	portLine = 7000 // TCP: answers each line with the backend's name
	portUDP  = 5000 // UDP: answers each datagram with the backend's name
)

// tableSize is the Maglev table size of the tests' services.
const tableSize = 1021

// requireRoot skips tests that need privileges or tools this machine lacks.
func requireRoot(tb testing.TB) {
	tb.Helper()
	if os.Geteuid() != 0 {
		tb.Skip("needs root: BPF cgroup programs, cgroups and network namespaces")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		tb.Skip("needs root: iproute2 'ip' not found")
	}
	if _, err := cgroup2Root(); err != nil {
		tb.Skipf("needs root: %v", err)
	}
}

func suffix(tb testing.TB) string {
	var b [3]byte
	if _, err := rand.Read(b[:]); err != nil {
		tb.Fatal(err)
	}
	return hex.EncodeToString(b[:])
}

func sh(tb testing.TB, args ...string) {
	tb.Helper()
	out, err := exec.Command(args[0], args[1:]...).CombinedOutput()
	if err != nil {
		tb.Fatalf("%s: %v: %s", strings.Join(args, " "), err, out)
	}
}

// cgroup2Root returns where the cgroup v2 hierarchy is mounted (/sys/fs/cgroup, or
// /sys/fs/cgroup/unified on hybrid systems).
func cgroup2Root() (string, error) {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return "", fmt.Errorf("read mountinfo: %w", err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		// id parent major:minor root mountpoint options [optional...] - fstype source ...
		f := strings.Fields(line)
		sep := slices.Index(f, "-")
		if sep >= 5 && sep+1 < len(f) && f[sep+1] == "cgroup2" && f[3] == "/" {
			return f[4], nil
		}
	}
	return "", errors.New("no cgroup v2 hierarchy is mounted")
}

// newCgroup creates a cgroup for one test, a child of parent ("": of the v2 root). At
// cleanup it makes sure that no process is left in it (only the test's own processes
// can be there: nobody else knows the directory) and removes it.
func newCgroup(tb testing.TB, parent, name string) string {
	tb.Helper()
	if parent == "" {
		root, err := cgroup2Root()
		if err != nil {
			tb.Skipf("needs root: %v", err)
		}
		parent = root
	}
	dir := filepath.Join(parent, "lbd-socklb-"+name+"-"+suffix(tb))
	if err := os.Mkdir(dir, 0o755); err != nil {
		tb.Fatalf("create cgroup: %v", err)
	}
	tb.Cleanup(func() {
		deadline := time.Now().Add(5 * time.Second)
		for {
			procs, _ := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
			pids := strings.Fields(string(procs))
			if len(pids) == 0 {
				break
			}
			if time.Now().After(deadline) {
				tb.Errorf("cgroup %s still holds processes %v", dir, pids)
				return
			}
			for _, p := range pids {
				var pid int
				if _, err := fmt.Sscan(p, &pid); err == nil {
					_ = syscall.Kill(pid, syscall.SIGKILL)
				}
			}
			time.Sleep(50 * time.Millisecond)
		}
		for i := 0; ; i++ {
			err := os.Remove(dir)
			if err == nil || errors.Is(err, os.ErrNotExist) {
				return
			}
			if i == 50 {
				tb.Errorf("remove cgroup %s: %v", dir, err)
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
	})
	return dir
}

// inNS runs fn on a thread switched into ns.
func inNS(tb testing.TB, ns netns.NsHandle, fn func()) {
	tb.Helper()
	if err := nsdo.Run(ns, fn); err != nil {
		tb.Fatal(err)
	}
}

// backendNode is a network namespace with servers that answer with its name.
type backendNode struct {
	name         string
	addr4, addr6 netip.Addr
}

// env is the topology of a test:
//
//	client namespace ── veth ── backend namespace i (i = 1..n)
//	198.18.i.1/24, 2001:db8:i::1/64      198.18.i.2/24, 2001:db8:i::2/64
//
// Backends route everything else to the client. The client routes the VIP ranges
// 203.0.113.0/24 and 2001:db8:ffff::/64 to backend 1, which does not own them and
// does not forward: a packet that still carries a VIP goes nowhere. An lbxdp Datapath (loaded, not attached) holds the
// service state, and the socket programs are attached to a cgroup of the test's own.
type env struct {
	t        testing.TB
	client   string
	clientNS netns.NsHandle
	backends []*backendNode
	lb       *lbxdp.Datapath
	sock     *Datapath
	cgroup   string
	// byAddr names the backend that owns an address.
	byAddr map[netip.Addr]string
	// keys are the Maglev keys of the backends given to addBackend.
	keys map[uint32]string
}

func newEnv(tb testing.TB, nBackends int) *env {
	tb.Helper()
	requireRoot(tb)
	sfx := suffix(tb)
	e := &env{t: tb, client: "slc-" + sfx, byAddr: map[netip.Addr]string{}, keys: map[uint32]string{}}
	sh(tb, "ip", "netns", "add", e.client)
	tb.Cleanup(func() { _ = exec.Command("ip", "netns", "del", e.client).Run() })
	ipc := func(args ...string) { sh(tb, append([]string{"ip", "-n", e.client}, args...)...) }
	ipc("link", "set", "lo", "up")
	for i := 1; i <= nBackends; i++ {
		b := &backendNode{
			name:  fmt.Sprintf("be%d", i),
			addr4: netip.MustParseAddr(fmt.Sprintf("198.18.%d.2", i)),
			addr6: netip.MustParseAddr(fmt.Sprintf("2001:db8:%d::2", i)),
		}
		ns := fmt.Sprintf("slb%d-%s", i, sfx)
		sh(tb, "ip", "netns", "add", ns)
		tb.Cleanup(func() { _ = exec.Command("ip", "netns", "del", ns).Run() })
		ci, bi := fmt.Sprintf("sc%d%s", i, sfx), fmt.Sprintf("sb%d%s", i, sfx)
		ipc("link", "add", ci, "type", "veth", "peer", "name", bi, "netns", ns)
		ipc("addr", "add", fmt.Sprintf("198.18.%d.1/24", i), "dev", ci)
		ipc("addr", "add", fmt.Sprintf("2001:db8:%d::1/64", i), "dev", ci, "nodad")
		ipc("link", "set", ci, "up")
		ipb := func(args ...string) { sh(tb, append([]string{"ip", "-n", ns}, args...)...) }
		ipb("link", "set", "lo", "up")
		ipb("addr", "add", b.addr4.String()+"/24", "dev", bi)
		ipb("addr", "add", b.addr6.String()+"/64", "dev", bi, "nodad")
		ipb("link", "set", bi, "up")
		// Replies find the client whatever source address its socket kept (a UDP
		// socket keeps the one of its first connect()).
		ipb("route", "add", "default", "via", fmt.Sprintf("198.18.%d.1", i))
		ipb("route", "add", "default", "via", fmt.Sprintf("2001:db8:%d::1", i))
		waitLinkUp(tb, e.client, ci)
		waitLinkUp(tb, ns, bi)
		h, err := netns.GetFromName(ns)
		if err != nil {
			tb.Fatalf("open netns %s: %v", ns, err)
		}
		tb.Cleanup(func() { h.Close() })
		serveBackend(tb, h, b.name)
		e.backends = append(e.backends, b)
		e.byAddr[b.addr4], e.byAddr[b.addr6] = b.name, b.name
	}
	ipc("route", "add", "203.0.113.0/24", "via", "198.18.1.2")
	ipc("route", "add", "2001:db8:ffff::/64", "via", "2001:db8:1::2")
	h, err := netns.GetFromName(e.client)
	if err != nil {
		tb.Fatalf("open netns %s: %v", e.client, err)
	}
	tb.Cleanup(func() { h.Close() })
	e.clientNS = h

	e.lb, err = lbxdp.Load(lbxdp.Options{MaxServices: 64, MaxBackends: 64, ConntrackSize: 1024, AffinitySize: 1024, SourceRangeSize: 64})
	if err != nil {
		fatalLoad(tb, err)
	}
	tb.Cleanup(func() { e.lb.Close() })
	e.sock, err = Load(Options{LB: e.lb, RevNATSize: 4096, UDPSize: 1024, AffinitySize: 1024})
	if err != nil {
		fatalLoad(tb, err)
	}
	tb.Cleanup(func() { e.sock.Close() })
	e.cgroup = newCgroup(tb, "", "lb")
	links, err := e.sock.Attach(e.cgroup)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		for _, l := range links {
			l.Close()
		}
	})
	return e
}

// waitLinkUp waits until a new veth end transmits: until the kernel's link watcher
// has seen its carrier, it keeps the noop qdisc, which drops every packet (a lost
// first SYN costs a one-second retransmission, a lost datagram the test).
func waitLinkUp(tb testing.TB, ns, dev string) {
	tb.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		out, err := exec.Command("ip", "-n", ns, "-o", "link", "show", "dev", dev).CombinedOutput()
		if err != nil {
			tb.Fatalf("ip link show %s: %v: %s", dev, err, out)
		}
		if strings.Contains(string(out), "state UP") && !strings.Contains(string(out), "qdisc noop") {
			return
		}
		if time.Now().After(deadline) {
			tb.Fatalf("link %s in %s not up after 5 s: %s", dev, ns, out)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func fatalLoad(tb testing.TB, err error) {
	tb.Helper()
	var ve *ebpf.VerifierError
	if errors.As(err, &ve) {
		tb.Fatalf("%+v", ve)
	}
	tb.Fatal(err)
}

// serveBackend starts, in namespace ns, the servers of a backend called name. They
// stop at cleanup. The listening sockets belong to ns; their goroutines run anywhere.
func serveBackend(tb testing.TB, ns netns.NsHandle, name string) {
	tb.Helper()
	var (
		web, line net.Listener
		udp       net.PacketConn
		err       error
	)
	inNS(tb, ns, func() {
		if web, err = net.Listen("tcp", fmt.Sprintf(":%d", portHTTP)); err != nil {
			return
		}
		if line, err = net.Listen("tcp", fmt.Sprintf(":%d", portLine)); err != nil {
			return
		}
		udp, err = net.ListenPacket("udp", fmt.Sprintf(":%d", portUDP))
	})
	if err != nil {
		tb.Fatalf("start servers of %s: %v", name, err)
	}
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			fmt.Fprintln(w, name)
		}),
		ReadHeaderTimeout: 5 * time.Second,
	}
	var wg sync.WaitGroup
	wg.Add(3)
	go func() {
		defer wg.Done()
		_ = srv.Serve(web)
	}()
	var connsMu sync.Mutex
	conns := map[net.Conn]struct{}{}
	go func() {
		defer wg.Done()
		for {
			c, err := line.Accept()
			if err != nil {
				return
			}
			connsMu.Lock()
			conns[c] = struct{}{}
			connsMu.Unlock()
			go func() {
				defer func() {
					connsMu.Lock()
					delete(conns, c)
					connsMu.Unlock()
					c.Close()
				}()
				rd := bufio.NewReader(c)
				for {
					if _, err := rd.ReadString('\n'); err != nil {
						return
					}
					if _, err := io.WriteString(c, name+"\n"); err != nil {
						return
					}
				}
			}()
		}
	}()
	go func() {
		defer wg.Done()
		buf := make([]byte, 1500)
		for {
			_, from, err := udp.ReadFrom(buf)
			if err != nil {
				return
			}
			_, _ = udp.WriteTo([]byte(name), from)
		}
	}()
	tb.Cleanup(func() {
		srv.Close()
		line.Close()
		udp.Close()
		connsMu.Lock()
		for c := range conns {
			c.Close()
		}
		connsMu.Unlock()
		wg.Wait()
	})
}

// Backend IDs: backend i (1-based) of e.backends is ID i on its IPv4 address, 20+i on
// its IPv6 address (both keeping the service's port) and 40+i on its IPv4 address
// with the fixed port 80.
func id4(i int) uint32    { return uint32(i) }
func id6(i int) uint32    { return uint32(20 + i) }
func id4p80(i int) uint32 { return uint32(40 + i) }

// addBackends writes every backend of the topology under the IDs above.
func (e *env) addBackends() {
	e.t.Helper()
	for i, b := range e.backends {
		n := i + 1
		for _, be := range []struct {
			id   uint32
			addr netip.Addr
			port uint16
		}{{id4(n), b.addr4, 0}, {id6(n), b.addr6, 0}, {id4p80(n), b.addr4, portHTTP}} {
			if err := e.lb.UpsertBackend(be.id, lbxdp.Backend{Addr: be.addr, Port: be.port, Node: be.addr}); err != nil {
				e.t.Fatal(err)
			}
			e.keys[be.id] = maglev.Key(netip.AddrPortFrom(be.addr, be.port))
		}
	}
}

// service creates a service whose Maglev table holds the given backend IDs with the
// given weights (an empty map: no table).
func (e *env) service(k lbxdp.ServiceKey, s lbxdp.Service, weights map[uint32]uint32) {
	e.t.Helper()
	if err := e.lb.UpsertService(k, s); err != nil {
		e.t.Fatal(err)
	}
	if len(weights) > 0 {
		e.table(s.ID, weights)
	}
}

// table builds and installs a service's Maglev table; it returns the table.
func (e *env) table(serviceID uint32, weights map[uint32]uint32) []uint32 {
	e.t.Helper()
	var bs []maglev.Backend
	for id, w := range weights {
		bs = append(bs, maglev.Backend{ID: id, Key: e.keys[id], Weight: w})
	}
	t, err := maglev.Build(bs, tableSize)
	if err != nil {
		e.t.Fatal(err)
	}
	if err := e.lb.SetMaglevTable(serviceID, t); err != nil {
		e.t.Fatal(err)
	}
	return t
}

func (e *env) stats() Stats {
	e.t.Helper()
	s, err := e.sock.Stats()
	if err != nil {
		e.t.Fatal(err)
	}
	return s
}

// agent is a client process in the client namespace (see agent_test.go).
type agent struct {
	t      testing.TB
	cmd    *exec.Cmd
	in     io.WriteCloser
	out    *bufio.Scanner
	stderr *bytes.Buffer
}

// startAgent starts an agent in the client namespace, inside the cgroup at dir ("":
// stay in the test process's cgroup, where no programs of this test are attached). It
// stops at cleanup.
func (e *env) startAgent(dir string) *agent {
	e.t.Helper()
	exe, err := os.Executable()
	if err != nil {
		e.t.Fatal(err)
	}
	cmd := e.command(dir, exe, "-test.run=^$")
	// No asynchronous preemption signals: they would interrupt the agent's blocking
	// system calls.
	cmd.Env = append(os.Environ(), agentEnv+"=1", "GODEBUG=asyncpreemptoff=1")
	in, err := cmd.StdinPipe()
	if err != nil {
		e.t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		e.t.Fatal(err)
	}
	a := &agent{t: e.t, cmd: cmd, in: in, stderr: &bytes.Buffer{}}
	cmd.Stderr = a.stderr
	a.out = bufio.NewScanner(out)
	a.out.Buffer(make([]byte, 1<<20), 4<<20)
	if err := cmd.Start(); err != nil {
		e.t.Fatalf("start agent: %v", err)
	}
	e.t.Cleanup(func() {
		in.Close()
		done := make(chan struct{})
		go func() {
			_ = cmd.Wait()
			close(done)
		}()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	})
	return a
}

// command prepares a command run in the client namespace (`ip netns exec` replaces
// itself with it) and, when dir is set, born in the cgroup at dir (CLONE_INTO_CGROUP).
func (e *env) command(dir string, args ...string) *exec.Cmd {
	e.t.Helper()
	cmd := exec.Command("ip", append([]string{"netns", "exec", e.client}, args...)...)
	if dir != "" {
		f, err := os.Open(dir)
		if err != nil {
			e.t.Fatalf("open cgroup: %v", err)
		}
		// The child gets its own copy at fork; this one is only needed until then,
		// but exec.Cmd may start later, so it lives until the test ends.
		e.t.Cleanup(func() { f.Close() })
		cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: int(f.Fd())}
	}
	return cmd
}

// do sends one request and returns the response; an agent-level error fails the test.
func (a *agent) do(req agentReq) agentResp {
	a.t.Helper()
	b, err := json.Marshal(req)
	if err != nil {
		a.t.Fatal(err)
	}
	if _, err := a.in.Write(append(b, '\n')); err != nil {
		a.t.Fatalf("agent request: %v (stderr: %s)", err, a.stderr)
	}
	if !a.out.Scan() {
		a.t.Fatalf("agent gave no answer: %v (stderr: %s)", a.out.Err(), a.stderr)
	}
	var resp agentResp
	if err := json.Unmarshal(a.out.Bytes(), &resp); err != nil {
		a.t.Fatalf("agent answer %q: %v", a.out.Bytes(), err)
	}
	if resp.Err != "" {
		a.t.Fatalf("agent %s: %s", req.Op, resp.Err)
	}
	return resp
}

// one runs a request that yields exactly one result.
func (a *agent) one(req agentReq) agentResult {
	a.t.Helper()
	r := a.do(req).Results
	if len(r) != 1 {
		a.t.Fatalf("agent %s: %d results, want 1", req.Op, len(r))
	}
	return r[0]
}

// lineOnce connects to addr, sends a line and returns the backend that answered;
// any failure fails the test.
func (a *agent) lineOnce(addr string) agentResult {
	a.t.Helper()
	r := a.one(agentReq{Op: "tcp", Addr: addr, Send: "hello\n"})
	if r.Errno != 0 || r.Err != "" {
		a.t.Fatalf("connect %s: errno %d: %s", addr, r.Errno, r.Err)
	}
	r.Reply = replyName(r.Reply)
	return r
}

// capture records, in the client namespace, the TCP SYNs and UDP datagrams the
// client sends (an AF_PACKET socket on every interface).
type capture struct {
	fd   int
	stop chan struct{}
	done chan struct{}
	mu   sync.Mutex
	pkts []captured
}

// captured is one packet leaving the client namespace.
type captured struct {
	Proto uint8
	Dst   netip.AddrPort
}

func (e *env) startCapture() *capture {
	e.t.Helper()
	c := &capture{stop: make(chan struct{}), done: make(chan struct{})}
	var err error
	inNS(e.t, e.clientNS, func() {
		c.fd, err = unix.Socket(unix.AF_PACKET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, int(htons(unix.ETH_P_ALL)))
	})
	if err != nil {
		e.t.Fatalf("capture socket: %v", err)
	}
	tv := unix.NsecToTimeval((50 * time.Millisecond).Nanoseconds())
	if err := unix.SetsockoptTimeval(c.fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		unix.Close(c.fd)
		e.t.Fatalf("capture socket: %v", err)
	}
	go c.run()
	e.t.Cleanup(c.close)
	return c
}

func (c *capture) run() {
	defer close(c.done)
	buf := make([]byte, 65536)
	for {
		select {
		case <-c.stop:
			return
		default:
		}
		n, from, err := unix.Recvfrom(c.fd, buf, 0)
		if err != nil {
			continue
		}
		ll, ok := from.(*unix.SockaddrLinklayer)
		if !ok || ll.Pkttype != unix.PACKET_OUTGOING {
			continue
		}
		var first gopacket.Decoder
		switch htons(ll.Protocol) {
		case unix.ETH_P_IP:
			first = layers.LayerTypeIPv4
		case unix.ETH_P_IPV6:
			first = layers.LayerTypeIPv6
		default:
			continue
		}
		p := gopacket.NewPacket(slices.Clone(buf[:n]), first, gopacket.NoCopy)
		var dst netip.Addr
		if l, ok := p.NetworkLayer().(*layers.IPv4); ok {
			dst, _ = netip.AddrFromSlice(l.DstIP.To4())
		} else if l, ok := p.NetworkLayer().(*layers.IPv6); ok {
			dst, _ = netip.AddrFromSlice(l.DstIP)
		}
		var pk captured
		switch l := p.TransportLayer().(type) {
		case *layers.TCP:
			if !l.SYN || l.ACK {
				continue
			}
			pk = captured{Proto: lbxdp.ProtoTCP, Dst: netip.AddrPortFrom(dst, uint16(l.DstPort))}
		case *layers.UDP:
			pk = captured{Proto: lbxdp.ProtoUDP, Dst: netip.AddrPortFrom(dst, uint16(l.DstPort))}
		default:
			continue
		}
		c.mu.Lock()
		c.pkts = append(c.pkts, pk)
		c.mu.Unlock()
	}
}

// packets stops the capture and returns what it saw.
func (c *capture) packets() []captured {
	c.close()
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.pkts)
}

func (c *capture) close() {
	select {
	case <-c.stop:
		return
	default:
	}
	close(c.stop)
	<-c.done
	unix.Close(c.fd)
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

// Addresses of the tests' services. No namespace owns them.
var (
	vipA = netip.MustParseAddr("203.0.113.10")
	vipB = netip.MustParseAddr("203.0.113.11")
	vipC = netip.MustParseAddr("203.0.113.12")
	vip6 = netip.MustParseAddr("2001:db8:ffff::10")
)

func ap(a netip.Addr, port uint16) string { return netip.AddrPortFrom(a, port).String() }
