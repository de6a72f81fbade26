package lbctl

import (
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lbd-dev/lbd/daemon/apitest"
)

// TestServerErrors checks that an error from the server reaches stderr with its gRPC code,
// with exit code 1 and nothing on stdout.
func TestServerErrors(t *testing.T) {
	t.Parallel()
	srv := apitest.Start(t)
	ok(t, srv, "service", "create", "web", "--vip", "203.0.113.10", "--port", "80")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"service", "get", "nope"}, "lbctl: service \"nope\" not found (code: NotFound)\n"},
		{[]string{"service", "get", "nope", "-o", "json"}, "lbctl: service \"nope\" not found (code: NotFound)\n"},
		{[]string{"service", "delete", "nope"}, "(code: NotFound)\n"},
		{[]string{"service", "update", "nope", "--port", "81"}, "(code: NotFound)\n"},
		{[]string{"backend", "list", "nope"}, "(code: NotFound)\n"},
		{[]string{"backend", "drain", "web", "198.18.1.1:80"}, "(code: NotFound)\n"},
		{[]string{"service", "create", "web", "--vip", "203.0.113.11", "--port", "80"}, "(code: AlreadyExists)\n"},
		{[]string{"service", "create", "other", "--vip", "203.0.113.10", "--port", "80"}, "(code: AlreadyExists)\n"},
		{[]string{"service", "create", "bad", "--vip", "not-an-ip", "--port", "80"}, "(code: InvalidArgument)\n"},
		{[]string{"service", "create", "bad", "--vip", "203.0.113.12", "--port", "80", "--maglev-table-size", "100"}, "(code: InvalidArgument)\n"},
		{[]string{"service", "update", "web", "--source-range", "2001:db8::/32"}, "(code: InvalidArgument)\n"},
		{[]string{"backend", "add", "web", "[2001:db8::1]:80"}, "(code: InvalidArgument)\n"},
		{[]string{"bgp", "peer", "add", "198.18.0.1", "--as", "0"}, "(code: InvalidArgument)\n"},
	} {
		r := lbctl(t, srv, tc.args...)
		if r.code != ExitError || r.stdout != "" || !strings.HasPrefix(r.stderr, "lbctl: ") || !strings.HasSuffix(r.stderr, tc.want) ||
			strings.Count(r.stderr, "\n") != 1 {
			t.Errorf("%v: exit %d, stdout %q, stderr %q; want exit 1, no stdout, stderr ending %q", tc.args, r.code, r.stdout, r.stderr, tc.want)
		}
	}
	// A rejected request changed nothing.
	if svc := getService(t, srv, "web"); svc.Revision != 1 || len(svc.Backends) != 0 || len(svc.SourceRanges) != 0 {
		t.Errorf("service changed by rejected requests: %v", svc)
	}
}

func TestUnreachableServer(t *testing.T) {
	t.Parallel()
	for _, srv := range []string{"unix:///nonexistent/lbd.sock", "/nonexistent/lbd.sock"} {
		r := lbctl(t, srv, "--timeout", "2s", "service", "list")
		if r.code != ExitError || r.stdout != "" || !strings.HasPrefix(r.stderr, "lbctl: cannot reach lbd at "+srv+": ") ||
			!strings.HasSuffix(r.stderr, "(code: Unavailable)\n") {
			t.Errorf("--server %s: exit %d, stdout %q, stderr %q", srv, r.code, r.stdout, r.stderr)
		}
	}
}

// TestTimeout runs lbctl against a socket that accepts connections and never answers.
func TestTimeout(t *testing.T) {
	t.Parallel()
	dir, err := os.MkdirTemp("", "lbctl")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	sock := filepath.Join(dir, "mute.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn // held open, unanswered
	t.Cleanup(func() {
		l.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	start := time.Now()
	r := lbctl(t, sock, "--timeout", "300ms", "service", "list")
	if r.code != ExitError || r.stdout != "" || !strings.HasSuffix(r.stderr, " (--timeout 300ms) (code: DeadlineExceeded)\n") {
		t.Errorf("exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("took %v despite --timeout 300ms", d)
	}
}

func TestUsageErrors(t *testing.T) {
	t.Parallel()
	srv := apitest.Start(t)
	ok(t, srv, "service", "create", "web", "--vip", "203.0.113.10", "--port", "80")
	for _, tc := range []struct {
		args []string
		want string // in the first line of stderr
	}{
		{[]string{"bogus"}, `unknown command "bogus" for "lbctl"`},
		{[]string{"service", "lsit"}, `unknown command "lsit" for "lbctl service"; did you mean "list"?`},
		{[]string{"bgp", "peer", "remove", "198.18.0.1"}, `unknown command "remove" for "lbctl bgp peer"`},
		{[]string{"service", "list", "--bogus"}, "unknown flag: --bogus"},
		{[]string{"service", "list", "-o", "xml"}, `invalid argument "xml" for "-o, --output" flag: must be one of table, json, yaml`},
		{[]string{"service", "list", "extra"}, `"lbctl service list" takes no arguments`},
		{[]string{"service", "get"}, `"lbctl service get" takes 1 argument(s) (NAME), got 0`},
		{[]string{"backend", "set-weight", "web", "198.18.1.1:80"}, "takes 3 argument(s) (SERVICE, ADDR:PORT, WEIGHT), got 2"},
		{[]string{"backend", "set-weight", "web", "198.18.1.1:80", "heavy"}, `weight "heavy" is not a number`},
		{[]string{"service", "create", "x", "--port", "80"}, "--vip is required"},
		{[]string{"service", "create", "x", "--vip", "203.0.113.1"}, "--port is required"},
		{[]string{"service", "create", "x", "--vip", "203.0.113.1", "--port", "70000"}, `invalid argument "70000" for "--port"`},
		{[]string{"service", "create", "x", "--vip", "203.0.113.1", "--port", "80", "--protocol", "icmp"}, "must be one of tcp, udp, sctp"},
		{[]string{"service", "create", "x", "--vip", "203.0.113.1", "--port", "80", "--backend", "198.18.1.1"}, `"198.18.1.1" is not address:port`},
		{[]string{"service", "create", "x", "--vip", "203.0.113.1", "--port", "80", "--backend", "198.18.1.1:80,color=red"}, `unknown key "color"`},
		{[]string{"service", "create", "x", "--vip", "203.0.113.1", "--port", "80", "--backend", "198.18.1.1:80,weight=x"}, `weight "x" is not a number`},
		{[]string{"service", "create", "x", "--vip", "203.0.113.1", "--port", "80", "--backend", "198.18.1.1:80,weight=0"}, `weight 0 is not a weight (1-256)`},
		{[]string{"backend", "add", "web", "198.18.1.1:80", "--weight", "0"}, `--weight 0 is not a weight (1-256)`},
		{[]string{"service", "create", "x", "--vip", "203.0.113.1", "--port", "80", "--health-check-path", "/"}, "--health-check-path needs a health check"},
		{[]string{"service", "create", "x", "--vip", "203.0.113.1", "--port", "80", "--health-check", "none", "--health-check-rise", "2"}, "--health-check-rise contradicts --health-check none"},
		{[]string{"service", "create", "x", "--vip", "203.0.113.1", "--port", "80", "--health-check", "http", "--health-check-status", "2xx"}, `--health-check-status "2xx" is not N or MIN-MAX`},
		{[]string{"service", "update", "web"}, "nothing to change"},
		{[]string{"service", "update", "web", "-o", "json"}, "nothing to change"},
		{[]string{"service", "update", "web", "--owner", "x"}, "unknown flag: --owner"},
		{[]string{"backend", "add", "web", "198.18.1.1:80", "--state", "up"}, "must be one of active, draining, disabled"},
		{[]string{"backend", "add", "web", "198.18.1.1:80", "--quic-server-id", "0x0a"}, `--quic-server-id "0x0a" is not hex`},
		{[]string{"backend", "set-quic-server-id", "web", "198.18.1.1:80", "zz"}, `server ID "zz" is not hex`},
		{[]string{"service", "create", "x", "--vip", "203.0.113.1", "--port", "80", "--backend", "198.18.1.1:80,quic-id=g"}, `quic-id "g" is not hex`},
		{[]string{"service", "create", "x", "--vip", "203.0.113.1", "--port", "80", "--quic-config-id", "1"}, "--quic-config-id needs QUIC routing"},
		{[]string{"trace", "tcp", "198.51.100.7", "40000", "203.0.113.10", "80", "--quic-dcid", "0a0b"}, "for udp only"},
		{[]string{"trace", "udp", "198.51.100.7", "40000", "203.0.113.10", "80", "--quic-dcid", "0a0"}, "a connection ID of 1-20 bytes in hex"},
		{[]string{"backend", "drain", "web", "2001:db8::1:80"}, `"2001:db8::1:80" is not address:port (IPv6 as [address]:port)`},
		{[]string{"bgp", "peer", "add", "198.18.0.1"}, "--as is required"},
		{[]string{"bgp", "peer", "delete", "router1"}, `"router1" is not an IP address`},
		{[]string{"--timeout", "0s", "service", "list"}, "--timeout must be positive"},
		{[]string{"--server", "localhost:50051", "service", "list"}, "is a TCP address, and lbd accepts TCP clients only with mutual TLS: give --tls-cert and --tls-key"},
		{[]string{"--server", "localhost", "service", "list"}, `--server "localhost" is not unix:///path, /path or host:port`},
		{[]string{"--server", "localhost:0", "service", "list"}, `"0" is not a port`},
		{[]string{"--tls-ca", "/etc/ssl/ca.pem", "service", "list"}, "TLS flags apply only to a TCP --server"},
	} {
		// --server given first: the cases that set their own override it.
		r := lbctl(t, srv, tc.args...)
		first, _, _ := strings.Cut(r.stderr, "\n")
		if r.code != ExitUsage || r.stdout != "" || !strings.HasPrefix(first, "lbctl: ") || !strings.Contains(first, tc.want) ||
			!strings.Contains(r.stderr, "--help'.") {
			t.Errorf("%v: exit %d, stdout %q, stderr %q; want exit 2, no stdout, stderr with %q", tc.args, r.code, r.stdout, r.stderr, tc.want)
		}
	}
	// Usage errors change nothing.
	var list = ok(t, srv, "service", "list")
	if strings.Count(list, "\n") != 2 {
		t.Errorf("services after usage errors:\n%s", list)
	}
}

func TestHelp(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{{"--help"}, {}, {"service"}, {"backend", "--help"}, {"help", "bgp", "peer"}} {
		r := lbctl(t, "", args...)
		if r.code != ExitOK || !strings.Contains(r.stdout, "Usage:") || r.stderr != "" {
			t.Errorf("%v: exit %d, stdout %q, stderr %q", args, r.code, r.stdout, r.stderr)
		}
	}
	if r := lbctl(t, "", "--version"); r.code != ExitOK || r.stdout != "lbctl "+clientVersion()+"\n" {
		t.Errorf("--version: exit %d, stdout %q", r.code, r.stdout)
	}
}

// TestServerAddress checks where --server comes from (flag, then LBCTL_SERVER, then the
// default) and its accepted forms. It sets the environment, so it does not run in parallel.
func TestServerAddress(t *testing.T) {
	srv := apitest.Start(t)
	path := strings.TrimPrefix(srv, "unix://")
	ok(t, srv, "service", "create", "web", "--vip", "203.0.113.10", "--port", "80")

	t.Setenv(serverEnv, srv)
	if out := ok(t, "", "service", "list"); !strings.Contains(out, "web") {
		t.Errorf("with %s=%s: %q", serverEnv, srv, out)
	}
	// The flag wins over the environment, in each accepted form.
	t.Setenv(serverEnv, "unix:///nonexistent/lbd.sock")
	for _, s := range []string{srv, path, "unix:" + path} {
		if out := ok(t, s, "service", "list"); !strings.Contains(out, "web") {
			t.Errorf("--server %s: %q", s, out)
		}
		if out := ok(t, "", "-s", s, "service", "list"); !strings.Contains(out, "web") {
			t.Errorf("-s %s: %q", s, out)
		}
	}
	r := lbctl(t, "", "service", "list")
	if r.code != ExitError || !strings.Contains(r.stderr, "cannot reach lbd at unix:///nonexistent/lbd.sock") {
		t.Errorf("with a bad %s: exit %d, stderr %q", serverEnv, r.code, r.stderr)
	}
	t.Setenv(serverEnv, "")
	if r := lbctl(t, "", "--help"); !strings.Contains(r.stdout, `(default "`+defaultServer+`")`) {
		t.Errorf("help does not show the default server %s:\n%s", defaultServer, r.stdout)
	}
}
