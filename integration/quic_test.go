//go:build linux

package integration

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lbd-dev/lbd/internal/testnet"
	"github.com/lbd-dev/lbd/internal/testpki"
	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
	"github.com/quic-go/quic-go"
	"github.com/vishvananda/netlink"
)

// QUIC services of the test: the same servers behind a QUIC-aware service and a plain
// UDP one (the control).
const (
	quicPort      = 443
	quicPlainPort = 8443
	quicConfigID  = 1
	quicALPN      = "lbd-it"
	quicConns     = 20
)

// quicServerID is the QUIC-LB server ID of a backend node: two bytes.
func quicServerID(be *node) []byte { return []byte{0x5e, byte(be.addr4.As4()[3])} }

// quicLBIDs generates connection IDs in QUIC-LB's plaintext form: the config rotation
// in the first octet's top three bits (the rest random), the server ID, a random nonce.
type quicLBIDs struct{ sid []byte }

const quicNonceLen = 6

func (g quicLBIDs) GenerateConnectionID() (quic.ConnectionID, error) {
	b := make([]byte, g.ConnectionIDLen())
	if _, err := rand.Read(b); err != nil {
		return quic.ConnectionID{}, err
	}
	b[0] = quicConfigID<<5 | b[0]&0x1f
	copy(b[1:], g.sid)
	return quic.ConnectionIDFromBytes(b), nil
}

func (g quicLBIDs) ConnectionIDLen() int { return 1 + len(g.sid) + quicNonceLen }

// quicTLS makes a certificate for the servers and the pool that trusts it.
func quicTLS(t *testing.T) (*tls.Config, *x509.CertPool) {
	t.Helper()
	ca := testpki.NewCA(t, "lbd QUIC test CA")
	cert := ca.Issue(t, &x509.Certificate{Subject: pkix.Name{CommonName: "lbd.test"}, DNSNames: []string{"lbd.test"},
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}})
	return &tls.Config{Certificates: []tls.Certificate{cert.Pair(t)}, NextProtos: []string{quicALPN}}, ca.Pool()
}

// serveQUIC runs a QUIC server on the backend's address and port inside its namespace;
// it answers each stream with "<backend> <the client address it sees> <request>".
func serveQUIC(t *testing.T, be *node, port int, tlsConf *tls.Config) {
	t.Helper()
	var conn *net.UDPConn
	be.ns.Do(t, func() {
		var err error
		if conn, err = net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.AddrPortFrom(be.addr4, uint16(port)))); err != nil {
			t.Fatal(err)
		}
	})
	tr := &quic.Transport{Conn: conn, ConnectionIDGenerator: quicLBIDs{quicServerID(be)}}
	ln, err := tr.Listen(tlsConf, &quic.Config{MaxIdleTimeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close(); tr.Close(); conn.Close() })
	go func() {
		for {
			c, err := ln.Accept(context.Background())
			if err != nil {
				return
			}
			go func() {
				for {
					s, err := c.AcceptStream(context.Background())
					if err != nil {
						return
					}
					go func() {
						defer s.Close()
						req, err := io.ReadAll(io.LimitReader(s, 256))
						if err == nil {
							fmt.Fprintf(s, "%s %s %s", be.name, c.RemoteAddr(), req)
						}
					}()
				}
			}()
		}
	}()
}

// quicClient is one client connection on its own UDP socket in the client namespace.
type quicClient struct {
	local netip.AddrPort
	tr    *quic.Transport
	conn  *quic.Conn
}

func dialQUIC(t *testing.T, tb *testbed, to netip.AddrPort, pool *x509.CertPool) *quicClient {
	t.Helper()
	c := &quicClient{local: netip.AddrPortFrom(client4, uint16(tb.nextClientPort()))}
	var udp *net.UDPConn
	tb.clientNS.Do(t, func() {
		var err error
		if udp, err = net.ListenUDP("udp4", net.UDPAddrFromAddrPort(c.local)); err != nil {
			t.Fatal(err)
		}
	})
	c.tr = &quic.Transport{Conn: udp}
	t.Cleanup(func() { c.tr.Close(); udp.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var err error
	c.conn, err = c.tr.Dial(ctx, net.UDPAddrFromAddrPort(to), &tls.Config{RootCAs: pool, ServerName: "lbd.test", NextProtos: []string{quicALPN}},
		&quic.Config{MaxIdleTimeout: time.Minute})
	if err != nil {
		t.Fatalf("QUIC connection from %v to %v: %v", c.local, to, err)
	}
	return c
}

// ask sends one request on a new stream and returns the backend that answered.
func (c *quicClient) ask(req string, timeout time.Duration) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	s, err := c.conn.OpenStreamSync(ctx)
	if err != nil {
		return "", err
	}
	_ = s.SetDeadline(time.Now().Add(timeout))
	if _, err := io.WriteString(s, req); err != nil {
		return "", err
	}
	s.Close()
	b, err := io.ReadAll(s)
	if err != nil {
		return "", err
	}
	parts := strings.SplitN(string(b), " ", 3)
	if len(parts) != 3 || parts[2] != req {
		return "", fmt.Errorf("answer %q to %q", b, req)
	}
	return parts[0], nil
}

// rebindClients changes the source port of every UDP flow from the client to the VIP,
// as a NAT that lost its mappings would: an nftables SNAT to new ports, the
// namespace's conntrack flushed so that established flows take it too, and what the
// servers still send to the former ports dropped before conntrack sees it (a packet
// from the server first would make an entry without the SNAT, for the flow's life).
func rebindClients(t *testing.T, ns *testnet.NS, vip netip.Addr, ports string) {
	t.Helper()
	ns.Exec(t, "nft", "add table ip lbdrebind")
	ns.Exec(t, "nft", "add chain ip lbdrebind pre { type filter hook prerouting priority raw ; }")
	ns.Exec(t, "nft", fmt.Sprintf("add rule ip lbdrebind pre ip saddr %s udp sport { %d, %d } udp dport != %s drop",
		vip, quicPort, quicPlainPort, ports))
	ns.Exec(t, "nft", "add chain ip lbdrebind post { type nat hook postrouting priority srcnat ; }")
	ns.Exec(t, "nft", fmt.Sprintf("add rule ip lbdrebind post ip daddr %s udp dport { %d, %d } snat ip to %s:%s",
		vip, quicPort, quicPlainPort, client4, ports))
	ns.Do(t, func() {
		if err := netlink.ConntrackTableFlush(netlink.ConntrackTable); err != nil {
			t.Fatalf("flush the client's conntrack: %v", err)
		}
	})
}

func unbindClients(t *testing.T, ns *testnet.NS) {
	t.Helper()
	ns.Exec(t, "nft", "delete table ip lbdrebind")
	ns.Do(t, func() {
		if err := netlink.ConntrackTableFlush(netlink.ConntrackTable); err != nil {
			t.Fatalf("flush the client's conntrack: %v", err)
		}
	})
}

// quicRun opens quicConns connections to the service on port, notes each one's
// backend, rebinds every client port, adds be3 to the service, and asks each
// connection again. It returns how many connections lost their server (an error or
// another backend answered) and how many backend NAT entries carry a rebound port.
func quicRun(t *testing.T, tb *testbed, port int, pool *x509.CertPool, addBackend []string, ports string) (lost, rebound int) {
	t.Helper()
	vip := netip.AddrPortFrom(vip4, uint16(port))
	clients := make([]*quicClient, quicConns)
	first := make([]string, quicConns)
	for i := range clients {
		clients[i] = dialQUIC(t, tb, vip, pool)
		b, err := clients[i].ask(fmt.Sprintf("first-%d", i), 5*time.Second)
		if err != nil {
			t.Fatalf("connection %d from %v, before the rebinding: %v", i, clients[i].local, err)
		}
		first[i] = b
	}
	t.Logf("port %d: %d connections, first backends %v", port, quicConns, countOf(first))
	rebindClients(t, tb.clientNS, vip4, ports)
	defer unbindClients(t, tb.clientNS)
	tb.lbctlLBs(t, addBackend...)
	be3 := tb.backends[2]
	tb.waitSlots(t, addBackend[2], netip.AddrPortFrom(be3.addr4, uint16(port)), func(s uint32) bool { return s > 0 })

	var wg sync.WaitGroup
	errs := make([]error, quicConns)
	for i, c := range clients {
		wg.Go(func() {
			b, err := c.ask(fmt.Sprintf("second-%d", i), 8*time.Second)
			switch {
			case err != nil:
				errs[i] = err
			case b != first[i]:
				errs[i] = fmt.Errorf("answered by %s, the connection began on %s", b, first[i])
			}
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			lost++
			t.Logf("port %d: connection %d from %v (on %s) after the rebinding: %v", port, i, clients[i].local, first[i], err)
		}
	}
	// The backends saw the connections from the new ports: their NAT entries say so.
	var lo, hi uint32
	if _, err := fmt.Sscanf(ports, "%d-%d", &lo, &hi); err != nil {
		t.Fatal(err)
	}
	for _, be := range tb.backends {
		for _, c := range be.lbd.connections(t) {
			if c.GetTable() == "nat" && c.GetVipPort() == uint32(port) && c.GetClientPort() >= lo && c.GetClientPort() <= hi {
				rebound++
			}
		}
	}
	for _, c := range clients {
		c.conn.CloseWithError(0, "done")
	}
	return lost, rebound
}

func countOf(names []string) map[string]int {
	m := map[string]int{}
	for _, n := range names {
		m[n]++
	}
	return m
}

// TestQUICRebinding: quic-go clients and servers, the servers encoding their server IDs
// in their connection IDs (QUIC-LB plaintext). Mid-way every client's source port
// changes (an nftables SNAT in the client's namespace: NAT rebinding) and a backend
// joins. Through the QUIC-aware service every connection goes on with its server;
// through the same servers behind a plain UDP service (the control) connections are
// lost, which shows that the test can fail.
func TestQUICRebinding(t *testing.T) {
	requireEnv(t, "nft")
	tb := newTestbed(t, options{})
	tb.startLBD()
	tlsConf, pool := quicTLS(t)
	for _, be := range tb.backends {
		serveQUIC(t, be, quicPort, tlsConf)
		serveQUIC(t, be, quicPlainPort, tlsConf)
	}
	be1, be2, be3 := tb.backends[0], tb.backends[1], tb.backends[2]
	spec := func(be *node, port int, quicID bool) string {
		s := netip.AddrPortFrom(be.addr4, uint16(port)).String()
		if quicID {
			s += ",quic-id=" + hex.EncodeToString(quicServerID(be))
		}
		return s
	}
	tb.lbctlLBs(t, "service", "create", "h3", "--vip", vip4.String(), "--port", fmt.Sprint(quicPort), "--protocol", "udp",
		"--quic-server-id-length", "2", "--quic-config-id", fmt.Sprint(quicConfigID),
		"--backend", spec(be1, quicPort, true), "--backend", spec(be2, quicPort, true))
	tb.createService(t, svcSpec{"h3-plain", vip4, quicPlainPort, "udp", []string{spec(be1, quicPlainPort, false), spec(be2, quicPlainPort, false)}})
	tb.waitService(t, "h3", func(s *lbdv1.Service) error {
		if s.GetStatus().GetState() != lbdv1.ServiceState_SERVICE_STATE_READY {
			return errors.New(s.GetStatus().GetReason())
		}
		return nil
	})

	lost, rebound := quicRun(t, tb, quicPort, pool,
		[]string{"backend", "add", "h3", netip.AddrPortFrom(be3.addr4, quicPort).String(), "--quic-server-id", hex.EncodeToString(quicServerID(be3))},
		"50000-50999")
	t.Logf("QUIC-aware service: %d of %d connections lost after the rebinding and a new backend; %d backend NAT entries from rebound ports",
		lost, quicConns, rebound)
	if lost != 0 {
		t.Errorf("%d of %d connections lost their server through the QUIC-aware service", lost, quicConns)
	}
	if rebound < quicConns {
		t.Errorf("%d NAT entries from the rebound ports on the backends, want one per connection (%d): the rebinding did not happen", rebound, quicConns)
	}
	routes := map[string]uint64{}
	for _, lb := range tb.lbs {
		st, err := lb.lbd.lb.GetStats(context.Background(), &lbdv1.GetStatsRequest{})
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range st.GetQuicRoutes() {
			routes[r.GetName()] += r.GetCount()
		}
	}
	t.Logf("QUIC routes on the LB nodes: %v", routes)
	if routes["routed_cid"] == 0 || routes["fallback_client_cid"] == 0 {
		t.Errorf("QUIC route counters %v: want packets routed by connection ID and Initials by the 5-tuple", routes)
	}
	if m := tb.lbs[0].lbd.scrape(t); !strings.Contains(m, `lbd_quic_packets_total{route="routed_cid"}`) {
		t.Errorf("lb1's metrics lack lbd_quic_packets_total{route=\"routed_cid\"}")
	}
	// lbctl trace of a 1-RTT packet to be3's server ID, from a port no connection used.
	cid := append(append([]byte{quicConfigID<<5 | 0x1f}, quicServerID(be3)...), 1, 2, 3, 4, 5, 6)
	out := tb.lbs[0].lbd.lbctl(t, "trace", "udp", client4.String(), "40999", vip4.String(), fmt.Sprint(quicPort),
		"--quic-dcid", hex.EncodeToString(cid))
	t.Logf("lbctl trace:\n%s", out)
	if !strings.Contains(out, netip.AddrPortFrom(be3.addr4, quicPort).String()) || !strings.Contains(out, "QUIC: the server ID") {
		t.Errorf("lbctl trace of a packet to be3's server ID:\n%s", out)
	}

	plainLost, plainRebound := quicRun(t, tb, quicPlainPort, pool,
		[]string{"backend", "add", "h3-plain", netip.AddrPortFrom(be3.addr4, quicPlainPort).String()}, "51000-51999")
	t.Logf("control, plain UDP service: %d of %d connections lost; %d backend NAT entries from rebound ports", plainLost, quicConns, plainRebound)
	if plainRebound == 0 {
		t.Errorf("control: no backend NAT entry from the rebound ports: the rebinding did not happen")
	}
	if plainLost == 0 {
		t.Errorf("control: no connection lost through the plain UDP service after the rebinding: the test cannot tell QUIC routing from luck")
	}
}
