package authz

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net/url"
	"strconv"
	"strings"

	"github.com/lbd-dev/lbd/daemon/peercred"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
)

// Identity is who called: the names rules match, and the transport.
type Identity struct {
	Transport Transport
	// Names are what a rule's principals are matched against. TCP: the client
	// certificate's URI SANs if it has any, else its DNS SANs, else its subject (the
	// order gRPC's engine uses). Unix socket: "unix:uid:N", then "unix:gid:N" for the
	// primary and each supplementary group.
	Names []string
	// UID is the Unix socket peer's uid; -1 on TCP.
	UID int64
}

// Principal is the identity in one string, for logs, the audit trail and rate limits:
// "unix:uid:N" on the socket, the certificate's names joined by commas on TCP.
func (id Identity) Principal() string {
	if id.Transport == TransportUnix && len(id.Names) > 0 {
		return id.Names[0]
	}
	return strings.Join(id.Names, ",")
}

// errNoIdentity: the connection carries neither a verified certificate nor peer
// credentials (a server set up without either).
var errNoIdentity = errors.New("the connection carries no client identity (no verified certificate, no peer credentials)")

// IdentityOf returns the identity of ctx's peer. The transport is known from the kind of
// authentication the connection carries, which the client cannot choose.
func IdentityOf(ctx context.Context) (Identity, error) {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return Identity{}, errNoIdentity
	}
	if cr, ok := peercred.FromPeer(p.AuthInfo); ok {
		names := []string{"unix:uid:" + strconv.FormatUint(uint64(cr.UID), 10)}
		for _, g := range cr.GIDs {
			names = append(names, "unix:gid:"+strconv.FormatUint(uint64(g), 10))
		}
		return Identity{Transport: TransportUnix, Names: names, UID: int64(cr.UID)}, nil
	}
	info, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok || len(info.State.PeerCertificates) == 0 {
		return Identity{}, errNoIdentity
	}
	c := info.State.PeerCertificates[0]
	var names []string
	switch {
	case len(c.URIs) > 0:
		for _, u := range c.URIs {
			names = append(names, u.String())
		}
	case len(c.DNSNames) > 0:
		names = append(names, c.DNSNames...)
	default:
		names = append(names, c.Subject.String())
	}
	return Identity{Transport: TransportTCP, Names: names, UID: -1}, nil
}

// engineContext returns the context gRPC's engine decides on. The engine matches
// principals in TLS certificates only, so a Unix socket peer's names are handed to it
// as the URI SANs of a certificate that exists only in this context; it never reaches a
// handler, and its names cannot come from a client certificate, since a TCP client is
// decided by the TCP engine.
func engineContext(ctx context.Context, id Identity) context.Context {
	if id.Transport != TransportUnix {
		return ctx
	}
	p, _ := peer.FromContext(ctx)
	cert := &x509.Certificate{}
	for _, n := range id.Names {
		cert.URIs = append(cert.URIs, &url.URL{Scheme: "unix", Opaque: strings.TrimPrefix(n, "unix:")})
	}
	bridged := *p
	bridged.AuthInfo = credentials.TLSInfo{State: tls.ConnectionState{PeerCertificates: []*x509.Certificate{cert}}}
	return peer.NewContext(ctx, &bridged)
}
