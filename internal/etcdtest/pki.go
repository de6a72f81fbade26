//go:build linux

package etcdtest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// CA is a certificate authority made for one test, as docs/deploy-fleet.md makes one
// with OpenSSL: EC P-256, the members' certificates for their name and address, for
// servers and clients (their peers), and clients' certificates for clients only.
type CA struct {
	tb   testing.TB
	dir  string
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	// File is the CA's certificate (PEM): what members and clients trust.
	File string
}

// NewCA makes a CA whose files go to dir, named after name.
func NewCA(tb testing.TB, dir, name string) *CA {
	tb.Helper()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		tb.Fatal(err)
	}
	ca := &CA{tb: tb, dir: dir}
	tmpl := &x509.Certificate{
		Subject:               pkix.Name{CommonName: name},
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	ca.cert, ca.key = ca.issue(tmpl, nil, nil)
	ca.File = filepath.Join(dir, name+".pem")
	ca.write(ca.File, "CERTIFICATE", ca.cert.Raw)
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
	cert, key := ca.issue(tmpl, ca.cert, ca.key)
	der, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		ca.tb.Fatal(err)
	}
	certFile, keyFile = filepath.Join(ca.dir, name+".pem"), filepath.Join(ca.dir, name+".key")
	ca.write(certFile, "CERTIFICATE", cert.Raw)
	ca.write(keyFile, "EC PRIVATE KEY", der)
	return certFile, keyFile
}

// issue signs tmpl with parent's key (itself when parent is nil) and a new key.
func (ca *CA) issue(tmpl, parent *x509.Certificate, parentKey *ecdsa.PrivateKey) (*x509.Certificate, *ecdsa.PrivateKey) {
	ca.tb.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		ca.tb.Fatal(err)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 64))
	if err != nil {
		ca.tb.Fatal(err)
	}
	tmpl.SerialNumber = serial
	tmpl.NotBefore, tmpl.NotAfter = time.Now().Add(-time.Hour), time.Now().Add(24*time.Hour)
	if parent == nil {
		parent, parentKey = tmpl, key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &key.PublicKey, parentKey)
	if err != nil {
		ca.tb.Fatalf("issue a certificate for %s: %v", tmpl.Subject.CommonName, err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		ca.tb.Fatal(err)
	}
	return cert, key
}

func (ca *CA) write(path, typ string, der []byte) {
	ca.tb.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
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
	pool := x509.NewCertPool()
	pool.AddCert(ca.cert)
	return &tls.Config{Certificates: []tls.Certificate{cert}, RootCAs: pool, MinVersion: tls.VersionTLS12}
}

// memberIP is the address a member's certificate is valid for.
func memberIP(url string) net.IP {
	host, _, err := net.SplitHostPort(url[len("https://"):])
	if err != nil {
		panic(fmt.Sprintf("member URL %q: %v", url, err))
	}
	return net.ParseIP(host)
}
