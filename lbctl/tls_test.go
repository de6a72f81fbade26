package lbctl

import (
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/lbd-dev/lbd/daemon/api"
	"github.com/lbd-dev/lbd/daemon/store"
	"github.com/lbd-dev/lbd/internal/testpki"
)

// issue returns a PEM certificate and key for a server (with the given DNS name and
// 127.0.0.1) or a client.
func issue(t *testing.T, ca *testpki.CA, server bool, dnsName string) (certPEM, keyPEM []byte) {
	t.Helper()
	tmpl := &x509.Certificate{
		Subject:     pkix.Name{CommonName: dnsName},
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	if server {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
		tmpl.DNSNames = []string{dnsName}
		tmpl.IPAddresses = []net.IP{net.IPv4(127, 0, 0, 1)}
	}
	c := ca.Issue(t, tmpl)
	return c.CertPEM, c.KeyPEM
}

func writeFile(t *testing.T, dir, name string, data []byte) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestTLS runs lbctl against the real API served on TCP with mutual TLS, the way lbd's
// TCP listener serves it.
func TestTLS(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ca, otherCA := testpki.NewCA(t, "lbd test CA"), testpki.NewCA(t, "other CA")
	srvCert, srvKey := issue(t, ca, true, "lbd.test")
	cliCert, cliKey := issue(t, ca, false, "operator")
	badCert, badKey := issue(t, otherCA, false, "intruder")
	files := map[string]string{}
	for name, data := range map[string][]byte{
		"ca.pem": ca.PEM, "other-ca.pem": otherCA.PEM, "client.pem": cliCert, "client-key.pem": cliKey,
		"bad.pem": badCert, "bad-key.pem": badKey, "garbage.pem": []byte("not PEM"),
	} {
		files[name] = writeFile(t, dir, name, data)
	}

	pair, err := tls.X509KeyPair(srvCert, srvKey)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca.Cert)
	st, err := store.Open(store.Options{Limits: store.DefaultLimits()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	g := grpc.NewServer(grpc.Creds(credentials.NewTLS(&tls.Config{
		Certificates: []tls.Certificate{pair},
		ClientAuth:   tls.RequireAndVerifyClientCert,
		ClientCAs:    pool,
		MinVersion:   tls.VersionTLS12,
	})))
	api.New(api.Options{Store: st, Roles: []string{"lb"}, Version: "v-tls"}).Register(g)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go g.Serve(lis)
	t.Cleanup(g.Stop)
	addr := lis.Addr().String()

	tlsArgs := func(cert, key, caFile string, extra ...string) []string {
		return append([]string{"--tls-cert", files[cert], "--tls-key", files[key], "--tls-ca", files[caFile], "--timeout", "5s"}, extra...)
	}
	out := ok(t, addr, tlsArgs("client.pem", "client-key.pem", "ca.pem", "version")...)
	if !strings.Contains(out, "Server:  v-tls") {
		t.Errorf("version over TLS: %q", out)
	}
	// The name to verify can differ from the dialed host.
	_, port, _ := net.SplitHostPort(addr)
	ok(t, "localhost:"+port, tlsArgs("client.pem", "client-key.pem", "ca.pem", "--tls-server-name", "lbd.test", "node", "get")...)

	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"server not trusted", tlsArgs("client.pem", "client-key.pem", "other-ca.pem", "node", "get"), "(code: Unavailable)"},
		{"wrong server name", tlsArgs("client.pem", "client-key.pem", "ca.pem", "--tls-server-name", "other.test", "node", "get"), "(code: Unavailable)"},
		{"client not trusted", tlsArgs("bad.pem", "bad-key.pem", "ca.pem", "node", "get"), "lbctl: "},
		{"unreadable key", tlsArgs("client.pem", "garbage.pem", "ca.pem", "node", "get"), "lbctl: load client certificate: "},
		{"CA file without certificates", tlsArgs("client.pem", "client-key.pem", "garbage.pem", "node", "get"), "lbctl: read CA bundle: no PEM certificate in "},
	} {
		r := lbctl(t, addr, tc.args...)
		if r.code != ExitError || r.stdout != "" || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("%s: exit %d, stdout %q, stderr %q; want exit 1 and %q", tc.name, r.code, r.stdout, r.stderr, tc.want)
		}
	}
}
