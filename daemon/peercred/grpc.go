package peercred

import (
	"context"
	"net"

	"google.golang.org/grpc/credentials"
)

// AuthInfo is the gRPC authentication information of a Unix socket peer.
type AuthInfo struct {
	credentials.CommonAuthInfo
	Creds Creds
}

// AuthType implements credentials.AuthInfo.
func (AuthInfo) AuthType() string { return "peercred" }

// Credentials are gRPC transport credentials for a server on a Listener: the peer's
// uid and groups become the connection's AuthInfo. The kernel vouches for them, and the
// socket never leaves the host, so the connection counts as private and authenticated.
type Credentials struct{}

// ServerHandshake implements credentials.TransportCredentials.
func (Credentials) ServerHandshake(c net.Conn) (net.Conn, credentials.AuthInfo, error) {
	pc, ok := c.(*Conn)
	if !ok {
		return nil, nil, ErrNotPeerConn
	}
	return c, AuthInfo{CommonAuthInfo: credentials.CommonAuthInfo{SecurityLevel: credentials.PrivacyAndIntegrity}, Creds: pc.Creds}, nil
}

// ClientHandshake implements credentials.TransportCredentials; these credentials are
// for servers only.
func (Credentials) ClientHandshake(context.Context, string, net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return nil, nil, ErrNotPeerConn
}

// Info implements credentials.TransportCredentials.
func (Credentials) Info() credentials.ProtocolInfo {
	return credentials.ProtocolInfo{SecurityProtocol: "peercred"}
}

// Clone implements credentials.TransportCredentials.
func (c Credentials) Clone() credentials.TransportCredentials { return c }

// OverrideServerName implements credentials.TransportCredentials.
func (Credentials) OverrideServerName(string) error { return nil }

// FromPeer returns the credentials of a Unix socket peer, if info is one.
func FromPeer(info credentials.AuthInfo) (Creds, bool) {
	a, ok := info.(AuthInfo)
	return a.Creds, ok
}
