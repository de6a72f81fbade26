// Package apitest starts lbd's real gRPC API in-process for tests of its clients: a real
// store persisting to a temporary directory, served on a Unix socket.
package apitest

import (
	"net"
	"os"
	"path/filepath"
	"testing"

	"github.com/lbd-dev/lbd/daemon/api"
	"github.com/lbd-dev/lbd/daemon/store"
	"google.golang.org/grpc"
)

// Server is a running in-process API.
type Server struct {
	// Addr is the address to dial: "unix:///path/to/socket".
	Addr string
	// Socket is the socket's path.
	Socket string
	Store  *store.Store
}

// Start serves the API until the test ends and returns its address for --server.
func Start(t testing.TB) string { return StartServer(t, store.DefaultLimits()).Addr }

// StartServer is Start with limits, returning the store too.
func StartServer(t testing.TB, lim store.Limits) *Server {
	return StartWithDatapath(t, lim, nil)
}

// StartWithDatapath is StartServer with a datapath behind the inspection RPCs (trace,
// connections, stats, detach); tests of clients pass a fake one.
func StartWithDatapath(t testing.TB, lim store.Limits, dp api.Datapath) *Server {
	return StartWithOptions(t, lim, api.Options{Datapath: dp})
}

// StartWithOptions serves the API with opts (datapath, BGP); the logger and version are
// set here, and the store unless opts has one (which the caller then closes).
func StartWithOptions(t testing.TB, lim store.Limits, opts api.Options) *Server {
	t.Helper()
	// Unix socket paths are limited to 108 bytes; t.TempDir can be longer.
	dir, err := os.MkdirTemp("", "lbd-apitest-")
	if err != nil {
		t.Fatalf("create socket dir: %v", err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	st, ownStore := opts.Store, opts.Store == nil
	if ownStore {
		if st, err = store.Open(store.Options{Path: filepath.Join(t.TempDir(), "state.pb"), Limits: lim}); err != nil {
			t.Fatalf("open store: %v", err)
		}
	}
	sock := filepath.Join(dir, "lbd.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatalf("listen: %v", err)
	}
	g := grpc.NewServer()
	opts.Store, opts.Version = st, "test"
	api.New(opts).Register(g)
	go func() { _ = g.Serve(ln) }() // returns when Stop is called below
	t.Cleanup(func() {
		g.Stop()
		if ownStore {
			st.Close()
		}
	})
	return &Server{Addr: "unix://" + sock, Socket: sock, Store: st}
}
