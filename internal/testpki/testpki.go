// Package testpki makes certificate authorities and certificates for tests, as the
// docs make them with OpenSSL: EC P-256 keys, certificates valid from an hour ago for
// a day, returned in memory and in PEM form.
package testpki

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"testing"
	"time"
)

// CA is a certificate authority made for one test.
type CA struct {
	Cert *x509.Certificate
	Key  *ecdsa.PrivateKey
	// PEM is the CA's certificate: what servers and clients trust.
	PEM []byte
}

// Issued is a certificate with its key.
type Issued struct {
	Cert            *x509.Certificate
	Key             *ecdsa.PrivateKey
	CertPEM, KeyPEM []byte
}

// NewCA makes a CA named name.
func NewCA(tb testing.TB, name string) *CA {
	tb.Helper()
	c := sign(tb, &x509.Certificate{
		Subject:               pkix.Name{CommonName: name},
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}, nil)
	return &CA{Cert: c.Cert, Key: c.Key, PEM: c.CertPEM}
}

// Issue signs tmpl (subject, usages, names; the serial number and validity are set
// here) with a new key.
func (ca *CA) Issue(tb testing.TB, tmpl *x509.Certificate) Issued {
	tb.Helper()
	return sign(tb, tmpl, ca)
}

// Pool is a certificate pool holding the CA.
func (ca *CA) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.Cert)
	return p
}

// Pair is the certificate and key as crypto/tls uses them.
func (i Issued) Pair(tb testing.TB) tls.Certificate {
	tb.Helper()
	pair, err := tls.X509KeyPair(i.CertPEM, i.KeyPEM)
	if err != nil {
		tb.Fatalf("load the key pair of %s: %v", i.Cert.Subject.CommonName, err)
	}
	return pair
}

// sign signs tmpl with parent's key, or with its own new key when parent is nil.
func sign(tb testing.TB, tmpl *x509.Certificate, parent *CA) Issued {
	tb.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		tb.Fatalf("generate a key: %v", err)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 64))
	if err != nil {
		tb.Fatalf("serial number: %v", err)
	}
	tmpl.SerialNumber = serial
	tmpl.NotBefore, tmpl.NotAfter = time.Now().Add(-time.Hour), time.Now().Add(24*time.Hour)
	signer, signerKey := tmpl, key
	if parent != nil {
		signer, signerKey = parent.Cert, parent.Key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, signer, &key.PublicKey, signerKey)
	if err != nil {
		tb.Fatalf("issue a certificate for %s: %v", tmpl.Subject.CommonName, err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		tb.Fatalf("parse the certificate of %s: %v", tmpl.Subject.CommonName, err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		tb.Fatalf("marshal the key of %s: %v", tmpl.Subject.CommonName, err)
	}
	return Issued{Cert: cert, Key: key,
		CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		KeyPEM:  pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder})}
}
