//go:build linux

package socklb

import (
	"bufio"
	"bytes"
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
	"github.com/lbd-dev/lbd/bpf/lbxdp"
	"github.com/lbd-dev/lbd/daemon/maglev"
	"github.com/lbd-dev/lbd/internal/pktgen"
	"github.com/lbd-dev/lbd/internal/testnet"
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
	dir := filepath.Join(parent, "lbd-socklb-"+name+"-"+testnet.Suffix(tb))
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
	client   *testnet.NS
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
	sfx := testnet.Suffix(tb)
	e := &env{t: tb, client: testnet.NewNS(tb, "slc-"+sfx), byAddr: map[netip.Addr]string{}, keys: map[uint32]string{}}
	for i := 1; i <= nBackends; i++ {
		b := &backendNode{
			name:  fmt.Sprintf("be%d", i),
			addr4: netip.MustParseAddr(fmt.Sprintf("198.18.%d.2", i)),
			addr6: netip.MustParseAddr(fmt.Sprintf("2001:db8:%d::2", i)),
		}
		ns := testnet.NewNS(tb, fmt.Sprintf("slb%d-%s", i, sfx))
		ci, bi := fmt.Sprintf("sc%d%s", i, sfx), fmt.Sprintf("sb%d%s", i, sfx)
		testnet.Veth(tb, testnet.VethEnd{NS: e.client, Name: ci}, testnet.VethEnd{NS: ns, Name: bi})
		e.client.AddAddr(tb, ci, netip.MustParsePrefix(fmt.Sprintf("198.18.%d.1/24", i)),
			netip.MustParsePrefix(fmt.Sprintf("2001:db8:%d::1/64", i)))
		ns.AddAddr(tb, bi, netip.PrefixFrom(b.addr4, 24), netip.PrefixFrom(b.addr6, 64))
		// Replies find the client whatever source address its socket kept (a UDP
		// socket keeps the one of its first connect()).
		ns.IP(tb, fmt.Sprintf("route add default via 198.18.%d.1", i), fmt.Sprintf("route add default via 2001:db8:%d::1", i))
		e.client.WaitUp(tb, ci)
		ns.WaitUp(tb, bi)
		serveBackend(tb, ns, b.name)
		e.backends = append(e.backends, b)
		e.byAddr[b.addr4], e.byAddr[b.addr6] = b.name, b.name
	}
	e.client.IP(tb, "route add 203.0.113.0/24 via 198.18.1.2", "route add 2001:db8:ffff::/64 via 2001:db8:1::2")

	var err error
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
func serveBackend(tb testing.TB, ns *testnet.NS, name string) {
	tb.Helper()
	var (
		web, line net.Listener
		udp       net.PacketConn
		err       error
	)
	ns.Do(tb, func() {
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

// command prepares a command run in the client namespace and, when dir is set, born
// in the cgroup at dir.
func (e *env) command(dir string, args ...string) *exec.Cmd {
	e.t.Helper()
	cmd := e.client.Command(args...)
	if dir != "" {
		testnet.InCgroup(e.t, cmd, dir)
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
// client sends (on every interface).
type capture struct{ *testnet.Capture }

// captured is one packet leaving the client namespace.
type captured struct {
	Proto uint8
	Dst   netip.AddrPort
}

func (e *env) startCapture() *capture {
	e.t.Helper()
	return &capture{e.client.Capture(e.t, "")}
}

// packets stops the capture and returns what it saw.
func (c *capture) packets() []captured {
	var pkts []captured
	for _, f := range c.Stop() {
		if !f.Outgoing {
			continue
		}
		p := pktgen.Parse(f.Data)
		var pk captured
		switch {
		case p.TCP != nil:
			if !p.TCP.SYN || p.TCP.ACK {
				continue
			}
			pk = captured{Proto: lbxdp.ProtoTCP, Dst: netip.AddrPortFrom(p.Dst(), uint16(p.TCP.DstPort))}
		case p.UDP != nil:
			pk = captured{Proto: lbxdp.ProtoUDP, Dst: netip.AddrPortFrom(p.Dst(), uint16(p.UDP.DstPort))}
		default:
			continue
		}
		pkts = append(pkts, pk)
	}
	return pkts
}

// Addresses of the tests' services. No namespace owns them.
var (
	vipA = netip.MustParseAddr("203.0.113.10")
	vipB = netip.MustParseAddr("203.0.113.11")
	vipC = netip.MustParseAddr("203.0.113.12")
	vip6 = netip.MustParseAddr("2001:db8:ffff::10")
)

func ap(a netip.Addr, port uint16) string { return netip.AddrPortFrom(a, port).String() }
