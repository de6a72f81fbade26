//go:build linux

// Package etcdtest runs real etcd clusters for tests: every member is an etcd process
// (the release internal/etcdtest/testbin pins, built by `make etcd-testbin`), either on
// the loopback of the test's own namespace with free ports, or each in a network
// namespace of its own on an address of the test network. Tests stop, kill and restart
// members to see what clients of the cluster do.
//
// Members are processes of testnet.Start: they are killed by their PID when the test
// ends, whatever happened, and their logs are shown if it failed.
package etcdtest

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/lbd-dev/lbd/internal/testnet"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
)

// Version is the etcd release the tests run; testbin/build.sh builds it.
const Version = "v3.6.8"

// Binary returns the path of the etcd server, and skips the test if it is missing:
// $LBD_ETCD_DIR/etcd, else the cache directory build.sh fills.
func Binary(tb testing.TB) string {
	tb.Helper()
	p := filepath.Join(Dir(), "etcd")
	if _, err := os.Stat(p); err != nil {
		tb.Skipf("needs etcd %s (make etcd-testbin builds it into %s): %v", Version, Dir(), err)
	}
	return p
}

// Dir is where the etcd binaries are looked for.
func Dir() string {
	if d := os.Getenv("LBD_ETCD_DIR"); d != "" {
		return d
	}
	home, err := os.UserHomeDir()
	if err != nil {
		home = os.TempDir()
	}
	return filepath.Join(home, ".cache", "lbd", "etcd", Version)
}

// Options shape a cluster; the zero value is three members on the loopback.
type Options struct {
	// Members is the cluster's size (default 3).
	Members int
	// Namespaces and Addrs, when set (one per member), run member i inside
	// Namespaces[i] on Addrs[i], ports 2379 (clients) and 2380 (peers). Otherwise every
	// member listens on 127.0.0.1 of the test's namespace with free ports.
	Namespaces []*testnet.NS
	Addrs      []netip.Addr
	// Dir holds the members' data directories and logs (default: a test temp dir).
	Dir string
	// TLS runs the members as docs/deploy-fleet.md does: https for clients and peers,
	// with certificates of a CA made for the test (Cluster.CA), and client
	// certificates required of both.
	TLS bool
}

// Cluster is a running etcd cluster.
type Cluster struct {
	tb      testing.TB
	bin     string
	Members []*Member
	// CA issued the members' certificates (Options.TLS); nil without TLS. Clients
	// need a certificate of it (CA.Issue).
	CA        *CA
	clientTLS *tls.Config
}

// Member is one etcd process of a cluster.
type Member struct {
	c         *Cluster
	Name      string
	ClientURL string
	PeerURL   string
	ns        *testnet.NS
	dir, log  string
	// certFile and keyFile are its certificate, for clients and peers (TLS).
	certFile, keyFile string
	initial           string // --initial-cluster
	proc              *testnet.Proc
	// stopped is set by Stop and Kill: the member is not meant to run.
	stopped bool
}

// Start starts a cluster and waits until it elects a leader and serves writes.
func Start(tb testing.TB, opts Options) *Cluster {
	tb.Helper()
	c := &Cluster{tb: tb, bin: Binary(tb)}
	n := opts.Members
	if n == 0 {
		n = 3
	}
	if opts.Namespaces != nil && (len(opts.Namespaces) != n || len(opts.Addrs) != n) {
		tb.Fatalf("etcdtest: %d members need %d namespaces and addresses, got %d and %d", n, n, len(opts.Namespaces), len(opts.Addrs))
	}
	dir := opts.Dir
	if dir == "" {
		dir = tb.TempDir()
	}
	scheme := "http://"
	if opts.TLS {
		scheme = "https://"
		c.CA = NewCA(tb, filepath.Join(dir, "pki"), "etcdtest-ca")
		c.clientTLS = c.CA.clientTLS()
	}
	var initial []string
	for i := range n {
		m := &Member{c: c, Name: fmt.Sprintf("m%d", i+1)}
		if opts.Namespaces != nil {
			m.ns = opts.Namespaces[i]
			m.ClientURL = scheme + net.JoinHostPort(opts.Addrs[i].String(), "2379")
			m.PeerURL = scheme + net.JoinHostPort(opts.Addrs[i].String(), "2380")
		} else {
			m.ClientURL = scheme + "127.0.0.1:" + strconv.Itoa(freePort(tb))
			m.PeerURL = scheme + "127.0.0.1:" + strconv.Itoa(freePort(tb))
		}
		if opts.TLS {
			m.certFile, m.keyFile = c.CA.Issue(m.Name, memberIP(m.ClientURL))
		}
		m.dir = filepath.Join(dir, "etcd-"+m.Name)
		m.log = filepath.Join(dir, "etcd-"+m.Name+".log")
		initial = append(initial, m.Name+"="+m.PeerURL)
		c.Members = append(c.Members, m)
	}
	for _, m := range c.Members {
		m.initial = strings.Join(initial, ",")
		m.Start()
	}
	c.WaitHealthy(30 * time.Second)
	return c
}

// freePort returns a TCP port of 127.0.0.1 that nothing listened on a moment ago.
func freePort(tb testing.TB) int {
	tb.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// Endpoints are the members' client URLs.
func (c *Cluster) Endpoints() []string {
	var out []string
	for _, m := range c.Members {
		out = append(out, m.ClientURL)
	}
	return out
}

// dialOptions make the clients of the test dial from the first member's namespace
// when the members run in namespaces: their addresses exist only there, and nothing
// may be sent to them from the test's own namespace.
func (c *Cluster) dialOptions() []grpc.DialOption {
	ns := c.Members[0].ns
	if ns == nil {
		return nil
	}
	return []grpc.DialOption{grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
		var conn net.Conn
		err := ns.DoErr(func() error {
			var err error
			conn, err = (&net.Dialer{}).DialContext(ctx, "tcp", addr)
			return err
		})
		return conn, err
	})}
}

// Client returns a client of the whole cluster, closed when the test ends.
func (c *Cluster) Client() *clientv3.Client {
	c.tb.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: c.Endpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop(), DialOptions: c.dialOptions(), TLS: c.clientTLS})
	if err != nil {
		c.tb.Fatalf("etcd client: %v", err)
	}
	c.tb.Cleanup(func() { cli.Close() })
	return cli
}

// WaitHealthy waits until every running member answers and the cluster commits a
// write (a quorum with a leader).
func (c *Cluster) WaitHealthy(timeout time.Duration) {
	c.tb.Helper()
	deadline := time.Now().Add(timeout)
	var last error
	for time.Now().Before(deadline) {
		if last = c.healthy(); last == nil {
			return
		}
		for _, m := range c.Members {
			if m.proc != nil && !m.stopped && !m.proc.Running() {
				c.tb.Fatalf("etcd member %s exited:\n%s", m.Name, m.proc.Tail(30))
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	c.tb.Fatalf("etcd cluster not healthy after %v: %v", timeout, last)
}

// healthy checks every running member and a quorum write.
func (c *Cluster) healthy() error {
	var eps []string
	for _, m := range c.Members {
		if m.Running() {
			eps = append(eps, m.ClientURL)
		}
	}
	if len(eps) == 0 {
		return errors.New("no member runs")
	}
	for _, ep := range eps {
		if err := c.probe([]string{ep}, func(ctx context.Context, cli *clientv3.Client) error {
			_, err := cli.Status(ctx, ep)
			return err
		}); err != nil {
			return fmt.Errorf("member %s: %w", ep, err)
		}
	}
	return c.probe(eps, func(ctx context.Context, cli *clientv3.Client) error {
		_, err := cli.Put(ctx, "/etcdtest/health", time.Now().String())
		return err
	})
}

func (c *Cluster) probe(eps []string, fn func(context.Context, *clientv3.Client) error) error {
	// Its retries while members start are expected: no log of them.
	cli, err := clientv3.New(clientv3.Config{Endpoints: eps, DialTimeout: time.Second, Logger: zap.NewNop(), DialOptions: c.dialOptions(), TLS: c.clientTLS})
	if err != nil {
		return err
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	return fn(ctx, cli)
}

// WaitLeader waits until a running member is the leader of the running members (a
// quorum elected it), and returns it.
func (c *Cluster) WaitLeader(timeout time.Duration) *Member {
	c.tb.Helper()
	deadline := time.Now().Add(timeout)
	var last error
	for time.Now().Before(deadline) {
		var m *Member
		if m, last = c.leader(); last == nil {
			return m
		}
		time.Sleep(50 * time.Millisecond)
	}
	c.tb.Fatalf("no etcd leader after %v: %v", timeout, last)
	return nil
}

// leader asks every running member for the leader it follows: the one that names
// itself, if the others agree.
func (c *Cluster) leader() (*Member, error) {
	var lead *Member
	var ids []uint64
	for _, m := range c.Members {
		if !m.Running() {
			continue
		}
		var id, self uint64
		if err := c.probe([]string{m.ClientURL}, func(ctx context.Context, cli *clientv3.Client) error {
			st, err := cli.Status(ctx, m.ClientURL)
			if err == nil {
				id, self = st.Leader, st.Header.MemberId
			}
			return err
		}); err != nil {
			return nil, fmt.Errorf("member %s: %w", m.Name, err)
		}
		if id == 0 {
			return nil, fmt.Errorf("member %s has no leader", m.Name)
		}
		if id == self {
			lead = m
		}
		ids = append(ids, id)
	}
	for _, id := range ids {
		if id != ids[0] {
			return nil, fmt.Errorf("the members name different leaders: %x", ids)
		}
	}
	if lead == nil {
		return nil, errors.New("no running member leads")
	}
	return lead, nil
}

// Running reports whether the member's process runs.
func (m *Member) Running() bool { return m.proc != nil && m.proc.Running() }

// Start starts the member's process (again, after Stop or Kill: it keeps its data).
func (m *Member) Start() {
	tb := m.c.tb
	tb.Helper()
	if m.Running() {
		tb.Fatalf("etcd member %s already runs", m.Name)
	}
	if err := os.MkdirAll(m.dir, 0o700); err != nil {
		tb.Fatal(err)
	}
	argv := []string{m.c.bin,
		"--name", m.Name,
		"--data-dir", m.dir,
		"--listen-client-urls", m.ClientURL, "--advertise-client-urls", m.ClientURL,
		"--listen-peer-urls", m.PeerURL, "--initial-advertise-peer-urls", m.PeerURL,
		"--initial-cluster", m.initial, "--initial-cluster-state", "new",
		"--initial-cluster-token", "etcdtest",
		// The test machines are small and shared: leave elections room for a busy CPU.
		"--heartbeat-interval", "100", "--election-timeout", "1500",
		"--log-level", "warn",
		// Tests lose nothing they need when a member's writes are not fsynced: a
		// killed process's writes are in the page cache, only a machine crash loses them.
		"--unsafe-no-fsync",
	}
	if m.c.CA != nil {
		argv = append(argv,
			"--client-cert-auth", "--trusted-ca-file", m.c.CA.File, "--cert-file", m.certFile, "--key-file", m.keyFile,
			"--peer-client-cert-auth", "--peer-trusted-ca-file", m.c.CA.File, "--peer-cert-file", m.certFile, "--peer-key-file", m.keyFile)
	}
	var cmd *exec.Cmd
	if m.ns != nil {
		cmd = m.ns.Command(argv...)
	} else {
		cmd = exec.Command(argv[0], argv[1:]...)
	}
	m.proc = testnet.Start(tb, "etcd-"+m.Name, m.log, cmd)
	m.stopped = false
}

// Stop stops the member with SIGTERM and waits for it to exit.
func (m *Member) Stop() {
	tb := m.c.tb
	tb.Helper()
	m.stopped = true
	if !m.Running() {
		return
	}
	if err := m.proc.Signal(syscall.SIGTERM); err != nil {
		tb.Fatalf("stop etcd member %s: %v", m.Name, err)
	}
	select {
	case <-m.proc.Exited():
	case <-time.After(15 * time.Second):
		m.proc.Kill()
	}
}

// Kill kills the member with SIGKILL, as a crash would.
func (m *Member) Kill() {
	m.stopped = true
	if m.proc != nil {
		m.proc.Kill()
	}
}

// StopAll stops every member.
func (c *Cluster) StopAll() {
	for _, m := range c.Members {
		m.Stop()
	}
}

// StartStopped starts every member that is not running and waits until the cluster is
// healthy again.
func (c *Cluster) StartStopped(timeout time.Duration) {
	c.tb.Helper()
	for _, m := range c.Members {
		if !m.Running() {
			m.Start()
		}
	}
	c.WaitHealthy(timeout)
}
