// Package bgptest runs a plain GoBGP instance on loopback that plays the edge router
// for the tests of lbd's BGP speaker (daemon/bgp) and of the controller above it
// (daemon/advertise): no root, no network.
package bgptest

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	api "github.com/osrg/gobgp/v3/api"
	gobgplog "github.com/osrg/gobgp/v3/pkg/log"
	"github.com/osrg/gobgp/v3/pkg/server"
)

const (
	// RouterAS is the router's AS.
	RouterAS = 65000
	// SpeakerAS is the AS of the speaker under test.
	SpeakerAS = 65001
	// WaitFor bounds every wait; generous for a loaded 2-core machine.
	WaitFor = 45 * time.Second
)

// Logger returns an hclog logger that writes into the test log and keeps quiet once
// the test is over (GoBGP goroutines may still log then).
func Logger(t *testing.T) hclog.Logger {
	t.Helper()
	w := &testWriter{t: t}
	t.Cleanup(w.close)
	level := hclog.Warn
	if testing.Verbose() {
		level = hclog.Info
	}
	return hclog.New(&hclog.LoggerOptions{Name: t.Name(), Output: w, Level: level})
}

type testWriter struct {
	mu   sync.Mutex
	t    *testing.T
	done bool
}

func (w *testWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.done {
		w.t.Log(strings.TrimRight(string(p), "\n"))
	}
	return len(p), nil
}

func (w *testWriter) close() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.done = true
}

// Context returns a context that ends with the test, or after twice WaitFor.
func Context(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*WaitFor)
	t.Cleanup(cancel)
	return ctx
}

// Eventually polls f until it returns nil, failing the test with f's last error after
// WaitFor.
func Eventually(t *testing.T, what string, f func() error) {
	t.Helper()
	deadline := time.Now().Add(WaitFor)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not reached within %s: %v", what, WaitFor, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// FreePort returns a TCP port that was free on addr a moment ago.
func FreePort(t *testing.T, addr string) uint16 {
	t.Helper()
	l, err := net.Listen("tcp", net.JoinHostPort(addr, "0"))
	if err != nil {
		t.Fatalf("find free port: %v", err)
	}
	defer l.Close()
	return uint16(l.Addr().(*net.TCPAddr).Port)
}

// Router is a plain GoBGP instance acting as an edge router, stopped when the test
// ends.
type Router struct {
	T      *testing.T
	Server *server.BgpServer
	Addr   netip.Addr
	Port   uint16
}

// NewRouter starts a router listening on addr, on a free port, with router ID
// 198.18.255.1. It skips under the race detector.
func NewRouter(t *testing.T, addr string) *Router {
	t.Helper()
	if raceEnabled {
		// GoBGP v3.37.0 is not race-clean with two instances in one process:
		// StartBgp writes package globals (table.SelectionOptions,
		// table.UseMultiplePaths) that every instance reads, and ListPath reads
		// stale flags that the server goroutine writes.
		t.Skip("GoBGP races with itself when two instances share a process; run without -race")
	}
	ctx := Context(t)
	var lastErr error
	// The free port can be taken between the probe and the bind: retry.
	for range 5 {
		port := FreePort(t, addr)
		s := server.NewBgpServer(server.LoggerOption(routerLog{Logger(t).Named("router")}))
		go s.Serve()
		err := s.StartBgp(ctx, &api.StartBgpRequest{Global: &api.Global{
			Asn:             RouterAS,
			RouterId:        "198.18.255.1",
			ListenPort:      int32(port),
			ListenAddresses: []string{addr},
		}})
		if err == nil {
			t.Cleanup(s.Stop)
			return &Router{T: t, Server: s, Addr: netip.MustParseAddr(addr), Port: port}
		}
		lastErr = err
		s.Stop()
	}
	t.Fatalf("start router on %s: %v", addr, lastErr)
	return nil
}

// NeighborOptions shape the router's side of a session.
type NeighborOptions struct {
	GracefulRestart bool
	RestartTime     uint32 // seconds, with GracefulRestart
	HoldTime        uint64 // seconds; 0: GoBGP's default
}

// AddNeighbor configures the speaker at addr (AS SpeakerAS) as a passive neighbor for
// IPv4 and IPv6 unicast: the speaker has no listener, so it always connects out.
func (r *Router) AddNeighbor(addr string, o NeighborOptions) {
	r.T.Helper()
	peer := &api.Peer{
		Conf:      &api.PeerConf{NeighborAddress: addr, PeerAsn: SpeakerAS},
		Transport: &api.Transport{PassiveMode: true},
	}
	for _, afi := range []api.Family_Afi{api.Family_AFI_IP, api.Family_AFI_IP6} {
		peer.AfiSafis = append(peer.AfiSafis, &api.AfiSafi{
			Config:            &api.AfiSafiConfig{Family: &api.Family{Afi: afi, Safi: api.Family_SAFI_UNICAST}, Enabled: true},
			MpGracefulRestart: &api.MpGracefulRestart{Config: &api.MpGracefulRestartConfig{Enabled: o.GracefulRestart}},
		})
	}
	if o.HoldTime != 0 {
		peer.Timers = &api.Timers{Config: &api.TimersConfig{HoldTime: o.HoldTime, KeepaliveInterval: o.HoldTime / 3}}
	}
	if o.GracefulRestart {
		peer.GracefulRestart = &api.GracefulRestart{Enabled: true, RestartTime: o.RestartTime}
	}
	if err := r.Server.AddPeer(Context(r.T), &api.AddPeerRequest{Peer: peer}); err != nil {
		r.T.Fatalf("router: add neighbor %s: %v", addr, err)
	}
}

// Neighbor returns the router's view of the speaker at addr.
func (r *Router) Neighbor(addr string) (*api.Peer, error) {
	var found *api.Peer
	err := r.Server.ListPeer(Context(r.T), &api.ListPeerRequest{Address: addr}, func(p *api.Peer) { found = p })
	if err != nil {
		return nil, err
	}
	if found == nil {
		return nil, fmt.Errorf("router has no neighbor %s", addr)
	}
	return found, nil
}

// WaitEstablished waits until the router's session with the speaker at addr is up.
func (r *Router) WaitEstablished(addr string) {
	r.T.Helper()
	Eventually(r.T, "router session with "+addr+" established", func() error {
		p, err := r.Neighbor(addr)
		if err != nil {
			return err
		}
		if s := p.GetState().GetSessionState(); s != api.PeerState_ESTABLISHED {
			return fmt.Errorf("state %s", s)
		}
		return nil
	})
}

// routerLog sends the router's warnings and errors to the test log.
type routerLog struct{ l hclog.Logger }

func (r routerLog) Panic(msg string, _ gobgplog.Fields) { r.l.Error(msg); panic(msg) }
func (r routerLog) Fatal(msg string, _ gobgplog.Fields) { r.l.Error(msg); panic(msg) }
func (r routerLog) Error(msg string, f gobgplog.Fields) { r.l.Error(msg, "fields", fmt.Sprint(f)) }
func (r routerLog) Warn(msg string, f gobgplog.Fields)  { r.l.Warn(msg, "fields", fmt.Sprint(f)) }
func (r routerLog) Info(string, gobgplog.Fields)        {}
func (r routerLog) Debug(string, gobgplog.Fields)       {}
func (r routerLog) SetLevel(gobgplog.LogLevel)          {}
func (r routerLog) GetLevel() gobgplog.LogLevel         { return gobgplog.WarnLevel }
