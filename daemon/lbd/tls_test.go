package lbd_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/lbd-dev/lbd/internal/testpki"
	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
)

// leaf issues a server or client certificate and returns it as a tls.Certificate and in
// PEM form (certificate, key).
func leaf(t testing.TB, c *testpki.CA, name string, usage x509.ExtKeyUsage, ips ...net.IP) (tls.Certificate, []byte, []byte) {
	t.Helper()
	cert := c.Issue(t, &x509.Certificate{
		Subject:     pkix.Name{CommonName: name},
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{usage},
		IPAddresses: ips,
	})
	return cert.Pair(t), cert.CertPEM, cert.KeyPEM
}

// freePort returns a TCP address on 127.0.0.1 that was free a moment ago.
func freePort(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("find a free port: %v", err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

func writeFile(t testing.TB, dir, name string, data []byte) string {
	t.Helper()
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatalf("write %s: %v", name, err)
	}
	return path
}

// tlsFixture is a server certificate for 127.0.0.1 and a client CA, written to files for
// lbd's flags.
type tlsFixture struct {
	ca                   *testpki.CA
	certFile, keyFile    string
	clientCAFile         string
	serverName           string
	clientCert           tls.Certificate
	rogueClientCert      tls.Certificate
	serverOnlyClientCert tls.Certificate
}

func newTLSFixture(t testing.TB) tlsFixture {
	dir := t.TempDir()
	root := testpki.NewCA(t, "lbd test CA")
	_, srvCert, srvKey := leaf(t, root, "lbd server", x509.ExtKeyUsageServerAuth, net.IPv4(127, 0, 0, 1))
	client, _, _ := leaf(t, root, "lbctl", x509.ExtKeyUsageClientAuth)
	serverOnly, _, _ := leaf(t, root, "not a client", x509.ExtKeyUsageServerAuth)
	rogue, _, _ := leaf(t, testpki.NewCA(t, "another CA"), "lbctl", x509.ExtKeyUsageClientAuth)
	return tlsFixture{
		ca:                   root,
		certFile:             writeFile(t, dir, "server.pem", srvCert),
		keyFile:              writeFile(t, dir, "server-key.pem", srvKey),
		clientCAFile:         writeFile(t, dir, "client-ca.pem", root.PEM),
		serverName:           "127.0.0.1",
		clientCert:           client,
		rogueClientCert:      rogue,
		serverOnlyClientCert: serverOnly,
	}
}

func (f tlsFixture) args(listen string) []string {
	return []string{"--listen", listen, "--tls-cert", f.certFile, "--tls-key", f.keyFile, "--tls-client-ca", f.clientCAFile}
}

// getNodeTCP calls GetNode over TCP with the given transport credentials.
func getNodeTCP(t *testing.T, addr string, creds credentials.TransportCredentials) (*lbdv1.GetNodeResponse, error) {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		t.Fatalf("dial %s: %v", addr, err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return lbdv1.NewNodeServiceClient(conn).GetNode(ctx, &lbdv1.GetNodeRequest{})
}

// TestMutualTLS checks the TCP listener: it serves the API to a client whose certificate
// chains to the client CA, and to nobody else.
func TestMutualTLS(t *testing.T) {
	f := newTLSFixture(t)
	addr := freePort(t)
	in := newInstance(t)
	dir := t.TempDir()
	policy := writeFile(t, dir, "policy.yaml", []byte("rules:\n  - role: reader\n    principals: [\"CN=lbctl\"]\n"))
	cfg := writeFile(t, dir, "lbd.yaml", []byte("api:\n  policy_file: "+policy+"\n"))
	startLBD(t, in, append(f.args(addr), "--config", cfg, "--metrics-listen", "")...)

	roots := x509.NewCertPool()
	roots.AddCert(f.ca.Cert)
	clientTLS := func(certs ...tls.Certificate) credentials.TransportCredentials {
		return credentials.NewTLS(&tls.Config{RootCAs: roots, ServerName: f.serverName, Certificates: certs})
	}

	res, err := getNodeTCP(t, addr, clientTLS(f.clientCert))
	if err != nil {
		t.Fatalf("GetNode with a valid client certificate the policy names: %v", err)
	}
	if res.Node.GetVersion() == "" {
		t.Errorf("GetNode over TCP: %v, want the node with its version", res)
	}

	for _, tc := range []struct {
		name  string
		creds credentials.TransportCredentials
	}{
		{"no client certificate", clientTLS()},
		{"client certificate of another CA", clientTLS(f.rogueClientCert)},
		{"certificate not for client authentication", clientTLS(f.serverOnlyClientCert)},
		{"plaintext", insecure.NewCredentials()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res, err := getNodeTCP(t, addr, tc.creds)
			if err == nil {
				t.Fatalf("GetNode succeeded: %v", res)
			}
			if code := status.Code(err); code != codes.Unavailable {
				t.Errorf("GetNode: %v, want code Unavailable (handshake refused)", err)
			}
			t.Logf("refused: %v", err)
		})
	}
}

// TestTCPDeniedWithoutPolicy checks the default: without a policy file, a client with a
// valid certificate is authenticated and then refused every call.
func TestTCPDeniedWithoutPolicy(t *testing.T) {
	f := newTLSFixture(t)
	addr := freePort(t)
	startLBD(t, newInstance(t), append(f.args(addr), "--metrics-listen", "")...)
	roots := x509.NewCertPool()
	roots.AddCert(f.ca.Cert)
	_, err := getNodeTCP(t, addr, credentials.NewTLS(&tls.Config{RootCAs: roots, ServerName: f.serverName, Certificates: []tls.Certificate{f.clientCert}}))
	if status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), "grants nothing on tcp") {
		t.Fatalf("GetNode without a policy: %v, want PERMISSION_DENIED saying the policy grants nothing on TCP", err)
	}
}

// TestTLSFilesMustLoad checks that the TCP listener does not start with certificate files
// it cannot use, and that the message says which.
func TestTLSFilesMustLoad(t *testing.T) {
	f := newTLSFixture(t)
	dir := t.TempDir()
	notPEM := writeFile(t, dir, "not-a-ca.pem", []byte("this is not a certificate\n"))
	for _, tc := range []struct {
		name          string
		cert, key, ca string
		want          []string
	}{
		{name: "missing server certificate", cert: filepath.Join(dir, "absent.pem"), key: f.keyFile, ca: f.clientCAFile, want: []string{"load server certificate", "absent.pem"}},
		{name: "key of another certificate", cert: f.certFile, key: writeFile(t, dir, "other-key.pem", otherKeyPEM(t, f)), ca: f.clientCAFile, want: []string{"load server certificate"}},
		{name: "client CA without a certificate", cert: f.certFile, key: f.keyFile, ca: notPEM, want: []string{"client CA", "not-a-ca.pem", "no PEM certificate"}},
		{name: "missing client CA", cert: f.certFile, key: f.keyFile, ca: filepath.Join(dir, "absent-ca.pem"), want: []string{"read client CA", "absent-ca.pem"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := newInstance(t)
			code, out := runExit(t, 5*time.Second, in.args("--listen", freePort(t), "--tls-cert", tc.cert, "--tls-key", tc.key, "--tls-client-ca", tc.ca)...)
			if code == 0 {
				t.Fatalf("lbd exited 0; output:\n%s", out)
			}
			assertContains(t, out, tc.want...)
			if _, err := os.Stat(in.socket); err == nil {
				t.Errorf("lbd left its socket %s behind", in.socket)
			}
		})
	}
}

// otherKeyPEM returns a valid key that does not match the fixture's server certificate.
func otherKeyPEM(t *testing.T, f tlsFixture) []byte {
	_, _, keyPEM := leaf(t, f.ca, "unrelated", x509.ExtKeyUsageServerAuth)
	return keyPEM
}
