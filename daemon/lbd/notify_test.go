//go:build linux

package lbd_test

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/lbd-dev/lbd/bpf/lbxdp"
	"github.com/lbd-dev/lbd/internal/testnet"
	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
	"github.com/vishvananda/netlink"
)

// notifyServices is how many services the LB node must write before it is ready: enough
// that the first sync takes a while after the programs are attached.
const notifyServices = 120

// notifySocket is systemd's end of the notify protocol: the datagram socket whose path
// goes to lbd as NOTIFY_SOCKET. Every message is kept with its arrival time.
type notifySocket struct {
	path string
	msgs chan notifyMsg
}

type notifyMsg struct {
	at   time.Time
	text string
}

func listenNotify(t *testing.T) *notifySocket {
	t.Helper()
	path := filepath.Join(shortTempDir(t), "notify")
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	s := &notifySocket{path: path, msgs: make(chan notifyMsg, 10000)}
	go func() {
		buf := make([]byte, 4096)
		for {
			n, err := conn.Read(buf)
			if err != nil {
				return
			}
			s.msgs <- notifyMsg{time.Now(), string(buf[:n])}
		}
	}()
	return s
}

// until returns the messages up to and including the first one holding line, failing
// the test after timeout.
func (s *notifySocket) until(t *testing.T, p *proc, line string, timeout time.Duration) []notifyMsg {
	t.Helper()
	var got []notifyMsg
	deadline := time.After(timeout)
	for {
		select {
		case m := <-s.msgs:
			got = append(got, m)
			if hasLine(m.text, line) {
				return got
			}
		case <-p.done:
			t.Fatalf("lbd exited before %q; messages %v; output:\n%s", line, got, p.stderr.String())
		case <-deadline:
			t.Fatalf("no %q within %v; messages %v; output:\n%s", line, timeout, got, p.stderr.String())
		}
	}
}

// during returns the messages that arrive within d.
func (s *notifySocket) during(d time.Duration) []notifyMsg {
	var got []notifyMsg
	end := time.After(d)
	for {
		select {
		case m := <-s.msgs:
			got = append(got, m)
		case <-end:
			return got
		}
	}
}

func hasLine(text, line string) bool {
	for _, l := range strings.Split(text, "\n") {
		if l == line || strings.HasPrefix(l, line) && strings.HasSuffix(line, ":") {
			return true
		}
	}
	return false
}

func countLines(msgs []notifyMsg, line string) int {
	n := 0
	for _, m := range msgs {
		if hasLine(m.text, line) {
			n++
		}
	}
	return n
}

// TestSystemdNotify starts an LB node the way systemd starts lbd-lb.service (Type=notify,
// WatchdogSec=): with NOTIFY_SOCKET and WATCHDOG_USEC. READY=1 must come only once the
// programs are attached and the maps hold every service of the restored state, the
// watchdog must be fed, a detached datapath must turn the status to "not ready" without
// starving the watchdog (systemd would otherwise restart lbd and undo the detach), and
// SIGTERM must say STOPPING=1.
func TestSystemdNotify(t *testing.T) {
	testnet.Require(t, "ip", "nsenter")
	in := newInstance(t)

	// The desired state comes first, through a control-plane-only lbd on the same state
	// directory: the LB node has all of it to write before it may call itself ready.
	cp, conn := startLBD(t, in)
	var svcs []*lbdv1.Service
	for i := range notifyServices {
		svc := &lbdv1.Service{Name: fmt.Sprintf("notify-%03d", i), Vip: fmt.Sprintf("203.0.113.%d", i+1),
			Port: 80, Protocol: lbdv1.Protocol_PROTOCOL_TCP, MaglevTableSize: 1021}
		for j := range 4 {
			svc.Backends = append(svc.Backends, &lbdv1.Backend{Address: fmt.Sprintf("198.18.%d.%d", i, j+10), Port: 8080})
		}
		svcs = append(svcs, svc)
	}
	if _, err := lbdv1.NewLoadBalancerServiceClient(conn).ApplyServices(ctxT(t),
		&lbdv1.ApplyServicesRequest{Owner: "notify-test", Services: svcs}); err != nil {
		t.Fatalf("apply %d services: %v", len(svcs), err)
	}
	cp.signal(t, syscall.SIGTERM)
	if code := cp.wait(t, 10*time.Second); code != 0 {
		t.Fatalf("control-plane lbd exit code %d", code)
	}
	conn.Close()

	sfx := testnet.Suffix(t)
	ns := testnet.NewNS(t, "sdn-"+sfx)
	testnet.Veth(t, testnet.VethEnd{NS: ns, Name: "up0"}, testnet.VethEnd{NS: ns, Name: "up1"})
	ns.PassXDP(t, "up1")
	bpffs := testnet.BPFFS(t)
	notify := listenNotify(t)

	cmd := ns.Command(append([]string{lbdBin}, in.args("--role", "lb", "--interface", "up0",
		"--bpffs-dir", bpffs, "--conntrack-size", "4096")...)...)
	cmd.Env = append(os.Environ(), "NOTIFY_SOCKET="+notify.path, "WATCHDOG_USEC=1000000")
	p := spawnCmd(t, cmd)
	before := notify.until(t, p, "READY=1", 60*time.Second)

	// At the moment READY=1 arrived: the sync was logged done, the XDP program is
	// attached, and every service is in the datapath's service map.
	if !strings.Contains(p.stderr.String(), "datapath maps synced") {
		t.Errorf("READY=1 arrived before lbd logged that its maps were synced; output:\n%s", p.stderr.String())
	}
	ns.Do(t, func() {
		l, err := netlink.LinkByName("up0")
		if err != nil {
			t.Fatal(err)
		}
		if x := l.Attrs().Xdp; x == nil || !x.Attached {
			t.Errorf("READY=1 arrived with no XDP program attached to up0 (%+v)", x)
		}
	})
	if n := mapEntries(t, filepath.Join(bpffs, "lb", lbxdp.MapServices)); n != notifyServices {
		t.Errorf("READY=1 arrived with %d of %d services in lb_services", n, notifyServices)
	}
	if countLines(before, "READY=1") != 1 || !hasLine(before[len(before)-1].text, "STATUS=ready:") {
		t.Errorf("want one READY=1 with a ready STATUS, got %v", before)
	}
	for _, m := range before[:len(before)-1] {
		if !hasLine(m.text, "STATUS=starting:") && m.text != "WATCHDOG=1" {
			t.Errorf("before READY=1: %q, want only STATUS=starting lines and watchdog pings", m.text)
		}
	}

	// WatchdogSec=1s: a ping every half second while lbd works.
	if n := countLines(notify.during(2500*time.Millisecond), "WATCHDOG=1"); n < 3 {
		t.Errorf("%d WATCHDOG=1 in 2.5 s with a 1 s watchdog, want at least 3", n)
	}

	// A detached node is not ready, and says so, but lbd is healthy: the watchdog goes on.
	if _, err := lbdv1.NewNodeServiceClient(dialUnix(t, in.socket)).DetachNode(ctxT(t), &lbdv1.DetachNodeRequest{}); err != nil {
		t.Fatalf("detach: %v", err)
	}
	after := notify.during(3 * time.Second)
	if countLines(after, "STATUS=not ready:") == 0 {
		t.Errorf("no not-ready STATUS after the detach: %v", after)
	}
	if n := countLines(after, "WATCHDOG=1"); n < 4 {
		t.Errorf("%d WATCHDOG=1 in 3 s after the detach, want the watchdog fed on (at least 4)", n)
	}
	if countLines(after, "READY=1") != 0 {
		t.Errorf("a second READY=1: %v", after)
	}

	p.signal(t, syscall.SIGTERM)
	notify.until(t, p, "STOPPING=1", 10*time.Second)
	if code := p.wait(t, 10*time.Second); code != 0 {
		t.Errorf("exit code %d after SIGTERM", code)
	}
}

// mapEntries counts the entries of a pinned map.
func mapEntries(t *testing.T, pin string) int {
	t.Helper()
	m, err := ebpf.LoadPinnedMap(pin, &ebpf.LoadPinOptions{ReadOnly: true})
	if err != nil {
		t.Fatalf("open %s: %v", pin, err)
	}
	defer m.Close()
	n := 0
	it := m.Iterate()
	key := make([]byte, m.KeySize())
	val := make([]byte, m.ValueSize())
	for it.Next(&key, &val) {
		n++
	}
	if err := it.Err(); err != nil {
		t.Fatalf("iterate %s: %v", pin, err)
	}
	return n
}

func (m notifyMsg) String() string { return fmt.Sprintf("%s %q", m.at.Format("15:04:05.000"), m.text) }
