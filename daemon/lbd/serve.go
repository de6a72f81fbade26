package lbd

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/lbd-dev/lbd/daemon/api"
	"github.com/lbd-dev/lbd/daemon/config"
	"github.com/lbd-dev/lbd/daemon/peercred"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"
)

// The API's listeners: the Unix socket, the mutual-TLS TCP listener, gRPC health.

// apiServers serve the API on the Unix socket and the optional TCP listener.
type apiServers struct {
	api    *api.Server
	unix   *grpc.Server
	tcp    *grpc.Server
	health *health.Server
	socket string
	// errc receives a listener's error.
	errc chan error
	// calls counts the handlers running on both servers.
	calls *inflight
	log   hclog.Logger
}

// startAPI listens and serves the API, every call through sec's interceptors.
func startAPI(c config.API, apiSrv *api.Server, sec *apiSecurity, log hclog.Logger) (*apiServers, error) {
	s := &apiServers{api: apiSrv, health: notServing(), errc: make(chan error, 2), calls: newInflight(), log: log}
	// The count is the outermost interceptor: it sees every call, refused ones included.
	opts := slices.Concat([]grpc.ServerOption{grpc.ChainStreamInterceptor(s.calls.stream), grpc.ChainUnaryInterceptor(s.calls.unary)},
		sec.opts, []grpc.ServerOption{grpc.ChainStreamInterceptor(apiSrv.StreamInterceptor), grpc.ChainUnaryInterceptor(apiSrv.UnaryInterceptor)})
	var tcpLn net.Listener
	tcpOpts := opts
	if c.TCP.Listen != "" {
		tlsCfg, err := serverTLS(c.TCP)
		if err != nil {
			return nil, err
		}
		if tcpLn, err = net.Listen("tcp", c.TCP.Listen); err != nil {
			return nil, fmt.Errorf("listen on %s: %w", c.TCP.Listen, err)
		}
		tcpOpts = slices.Concat(opts, []grpc.ServerOption{grpc.Creds(credentials.NewTLS(tlsCfg))})
	}
	// The Unix socket needs no TLS: the kernel tells who connected (SO_PEERCRED).
	s.unix = grpc.NewServer(slices.Concat(opts, []grpc.ServerOption{grpc.Creds(peercred.Credentials{})})...)
	s.tcp = grpc.NewServer(tcpOpts...)
	for _, g := range []*grpc.Server{s.unix, s.tcp} {
		apiSrv.Register(g)
		healthpb.RegisterHealthServer(g, s.health)
		reflection.Register(g)
	}
	if c.Socket != "" {
		ln, err := listenUnix(c)
		if err != nil {
			if tcpLn != nil {
				tcpLn.Close()
			}
			return nil, err
		}
		s.socket = c.Socket
		go func() { s.errc <- s.unix.Serve(ln) }()
		log.Info("API listening", "op", "start", "socket", c.Socket, "mode", c.SocketMode, "group", c.SocketGroup)
	}
	if tcpLn != nil {
		go func() { s.errc <- s.tcp.Serve(tcpLn) }()
		log.Info("API listening", "op", "start", "tcp", tcpLn.Addr().String(), "tls", "mutual")
	}
	return s, nil
}

// unreadWait is how long a stop lets clients read the last replies of streams whose
// handlers returned, once no call runs any more.
const unreadWait = time.Second

// stop ends every stream, lets unary calls finish for up to grace, then stops. Once
// every handler returned, it waits at most unreadWait more for clients to read what
// is queued for them: a client that stopped reading a watch does not hold the stop
// for the whole grace.
func (s *apiServers) stop(grace time.Duration) {
	s.health.Shutdown()
	s.api.Shutdown()
	if grace <= 0 {
		s.unix.Stop()
		s.tcp.Stop()
		return
	}
	done := make(chan struct{})
	go func() {
		s.unix.GracefulStop()
		s.tcp.GracefulStop()
		close(done)
	}()
	deadline := time.NewTimer(grace)
	defer deadline.Stop()
	select {
	case <-done:
		return
	case <-s.calls.drain():
		select {
		case <-done:
			return
		case <-deadline.C:
		case <-time.After(unreadWait):
		}
		s.log.Info("API stopped with replies its clients did not read", "op", "stop", "waited", unreadWait)
	case <-deadline.C:
		if n := s.calls.running(); n > 0 {
			s.log.Warn("API stopped with calls still running after the grace", "op", "stop", "grace", grace, "running", n)
		}
	}
	s.unix.Stop()
	s.tcp.Stop()
}

// remove deletes the socket file.
func (s *apiServers) remove() {
	if s.socket != "" {
		os.Remove(s.socket)
	}
}

// listenUnix listens on the API's Unix socket with the mode and group of c, reading
// each client's credentials as it connects. A stale socket file from a crashed daemon is
// replaced; a live one is an error.
func listenUnix(c config.API) (net.Listener, error) {
	path := c.Socket
	mode, gid, err := c.SocketPerm()
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("create socket directory: %w", err)
	}
	if c, err := net.DialTimeout("unix", path, time.Second); err == nil {
		c.Close()
		return nil, fmt.Errorf("socket %s: another lbd is listening on it", path)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("remove stale socket: %w", err)
	}
	// The umask makes the socket 0600 from its creation: no window in which others could
	// connect before its group and mode are set.
	old := syscall.Umask(0o177)
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	syscall.Umask(old)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", path, err)
	}
	if gid >= 0 {
		if err := os.Chown(path, -1, gid); err != nil {
			ln.Close()
			return nil, fmt.Errorf("api.socket_group: %w", err)
		}
	}
	if err := os.Chmod(path, mode); err != nil {
		ln.Close()
		return nil, fmt.Errorf("api.socket_mode: %w", err)
	}
	return peercred.NewListener(ln), nil
}

// serverTLS builds the TCP listener's TLS configuration: mutual TLS, client certificates
// required and verified against the client CA.
func serverTLS(c config.TCP) (*tls.Config, error) {
	if c.CertFile == "" || c.KeyFile == "" || c.ClientCAFile == "" {
		return nil, errors.New("the TCP listener requires a server certificate, key and client CA (mutual TLS only)")
	}
	cert, err := tls.LoadX509KeyPair(c.CertFile, c.KeyFile)
	if err != nil {
		return nil, fmt.Errorf("load server certificate: %w", err)
	}
	pem, err := os.ReadFile(c.ClientCAFile)
	if err != nil {
		return nil, fmt.Errorf("read client CA: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("client CA %s: no PEM certificate found", c.ClientCAFile)
	}
	return &tls.Config{
		Certificates: []tls.Certificate{cert},
		ClientAuth:   tls.RequireAndVerifyClientCert,
		ClientCAs:    pool,
		MinVersion:   tls.VersionTLS12,
	}, nil
}

// notServing is a gRPC health server that says NOT_SERVING until serveHealth says
// otherwise: grpc-go's starts SERVING, which a client that connects before serveHealth
// first ran would take for a ready node.
func notServing() *health.Server {
	hs := health.NewServer()
	hs.SetServingStatus("", healthpb.HealthCheckResponse_NOT_SERVING)
	return hs
}

// healthPoll is how often gRPC health follows the node's readiness.
const healthPoll = 500 * time.Millisecond

// serveHealth keeps grpc.health.v1 in line with the node's readiness until ctx ends:
// SERVING for the whole server ("") and every service while ready, NOT_SERVING while
// the datapath is detached or not yet in line with the desired state. It looks every
// poll (healthPoll), and at once when changed receives (the first sync done).
func serveHealth(ctx context.Context, hs *health.Server, srv *grpc.Server, ready func() (bool, string), changed <-chan struct{}, poll time.Duration) {
	names := []string{""}
	for name := range srv.GetServiceInfo() {
		names = append(names, name)
	}
	t := time.NewTicker(poll)
	defer t.Stop()
	for {
		st := healthpb.HealthCheckResponse_NOT_SERVING
		if ok, _ := ready(); ok {
			st = healthpb.HealthCheckResponse_SERVING
		}
		for _, n := range names {
			hs.SetServingStatus(n, st)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-changed:
		}
	}
}
