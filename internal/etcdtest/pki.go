//go:build linux

package etcdtest

import (
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"testing"

	"github.com/lbd-dev/lbd/internal/testpki"
)

// CA is a certificate authority made for one test, as docs/deploy-fleet.md makes one
// with OpenSSL (package testpki): the members' certificates for their name and
// address, for servers and clients (their peers), and clients' certificates for
// clients only, written to files.
type CA struct {
	tb  testing.TB
	dir string
	ca  *testpki.CA
	// File is the CA's certificate (PEM): what members and clients trust.
	File string
}

// NewCA makes a CA whose files go to dir, named after name.
func NewCA(tb testing.TB, dir, name string) *CA {
	tb.Helper()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		tb.Fatal(err)
	}
	ca := &CA{tb: tb, dir: dir, ca: testpki.NewCA(tb, name), File: filepath.Join(dir, name+".pem")}
	ca.write(ca.File, ca.ca.PEM)
	return ca
}

// Issue makes a certificate and key for name, valid for the given addresses (a member:
// server and client use) or for none (a client: client use only), and returns their
// files.
func (ca *CA) Issue(name string, addrs ...net.IP) (certFile, keyFile string) {
	ca.tb.Helper()
	tmpl := &x509.Certificate{
		Subject:     pkix.Name{CommonName: name},
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	if len(addrs) > 0 {
		tmpl.DNSNames, tmpl.IPAddresses = []string{name}, addrs
		tmpl.ExtKeyUsage = append(tmpl.ExtKeyUsage, x509.ExtKeyUsageServerAuth)
	}
	cert := ca.ca.Issue(ca.tb, tmpl)
	certFile, keyFile = filepath.Join(ca.dir, name+".pem"), filepath.Join(ca.dir, name+".key")
	ca.write(certFile, cert.CertPEM)
	ca.write(keyFile, cert.KeyPEM)
	return certFile, keyFile
}

func (ca *CA) write(path string, data []byte) {
	ca.tb.Helper()
	if err := os.WriteFile(path, data, 0o600); err != nil {
		ca.tb.Fatal(err)
	}
}

// clientTLS is the configuration of the test's own clients of a TLS cluster: they
// trust the CA and present a client certificate of it.
func (ca *CA) clientTLS() *tls.Config {
	ca.tb.Helper()
	certFile, keyFile := ca.Issue("etcdtest-client")
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		ca.tb.Fatal(err)
	}
	return &tls.Config{Certificates: []tls.Certificate{cert}, RootCAs: ca.ca.Pool(), MinVersion: tls.VersionTLS12}
}

// memberIP is the address a member's certificate is valid for.
func memberIP(url string) net.IP {
	host, _, err := net.SplitHostPort(url[len("https://"):])
	if err != nil {
		panic(fmt.Sprintf("member URL %q: %v", url, err))
	}
	return net.ParseIP(host)
}
