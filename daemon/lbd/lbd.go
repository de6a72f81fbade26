// Package lbd is the lbd daemon's entry point: flags and configuration, logging, the
// desired-state store, and the gRPC API on a Unix socket and an optional mutual-TLS TCP
// listener.
package lbd

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/lbd-dev/lbd/daemon/api"
	"github.com/lbd-dev/lbd/daemon/config"
	"github.com/lbd-dev/lbd/daemon/store"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"
)

// Version is set at build time (-ldflags "-X github.com/lbd-dev/lbd/daemon/lbd.Version=...").
var Version = "dev"

// StateFileName is the name of the state file inside the state directory.
const StateFileName = "state.pb"

// shutdownGrace bounds how long in-flight RPCs may run after SIGTERM.
const shutdownGrace = 10 * time.Second

// errVersion makes Main print the version instead of running.
var errVersion = errors.New("version requested")

// Main runs the daemon and returns its exit code.
func Main(args []string, stdout, stderr io.Writer) int {
	cfg, check, err := parseFlags(args, stderr)
	if errors.Is(err, errVersion) {
		fmt.Fprintln(stdout, "lbd", Version)
		return 0
	}
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "lbd: %v\n", err)
		return 2
	}
	if check {
		fmt.Fprintln(stdout, "configuration is valid")
		return 0
	}
	log := hclog.New(&hclog.LoggerOptions{
		Name:       "lbd",
		Level:      hclog.LevelFromString(cfg.Log.Level),
		JSONFormat: cfg.Log.JSON,
		Output:     stderr,
	})
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := run(ctx, cfg, log); err != nil {
		log.Error("lbd stopped", "error", err)
		return 1
	}
	return 0
}

func parseFlags(args []string, stderr io.Writer) (config.Config, bool, error) {
	fs := flag.NewFlagSet("lbd", flag.ContinueOnError)
	fs.SetOutput(stderr)
	cfgPath := fs.String("config", "", "configuration file (YAML; see examples/lbd.yaml)")
	check := fs.Bool("check-config", false, "validate the configuration and exit")
	version := fs.Bool("version", false, "print the version and exit")
	logLevel := fs.String("log-level", "", "log level: trace, debug, info, warn, error (overrides the file)")
	logJSON := fs.Bool("log-json", false, "log JSON lines (overrides the file)")
	stateDir := fs.String("state-dir", "", "directory of the desired-state file (overrides the file)")
	socket := fs.String("socket", "", "Unix socket of the API (overrides the file)")
	listen := fs.String("listen", "", "TCP address of the mutual-TLS API listener (overrides the file)")
	cert := fs.String("tls-cert", "", "server certificate for the TCP listener")
	key := fs.String("tls-key", "", "server key for the TCP listener")
	ca := fs.String("tls-client-ca", "", "CA that client certificates must chain to")
	role := fs.String("role", "", "roles: lb, backend or both (the datapath; not part of this build yet)")
	if err := fs.Parse(args); err != nil {
		return config.Config{}, false, err
	}
	if fs.NArg() > 0 {
		return config.Config{}, false, fmt.Errorf("unexpected arguments: %s", strings.Join(fs.Args(), " "))
	}
	if *version {
		return config.Config{}, false, errVersion
	}
	cfg := config.Default()
	if *cfgPath != "" {
		var err error
		if cfg, err = config.Load(*cfgPath); err != nil {
			return cfg, false, err
		}
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	override := func(name string, dst *string, v string) {
		if set[name] {
			*dst = v
		}
	}
	override("log-level", &cfg.Log.Level, *logLevel)
	override("state-dir", &cfg.StateDir, *stateDir)
	override("socket", &cfg.API.Socket, *socket)
	override("listen", &cfg.API.TCP.Listen, *listen)
	override("tls-cert", &cfg.API.TCP.CertFile, *cert)
	override("tls-key", &cfg.API.TCP.KeyFile, *key)
	override("tls-client-ca", &cfg.API.TCP.ClientCAFile, *ca)
	if set["log-json"] {
		cfg.Log.JSON = *logJSON
	}
	if set["role"] {
		switch *role {
		case "both":
			cfg.Roles = []string{config.RoleLB, config.RoleBackend}
		default:
			cfg.Roles = []string{*role}
		}
	}
	if err := cfg.Validate(); err != nil {
		return cfg, false, err
	}
	if len(cfg.Roles) > 0 {
		return cfg, false, fmt.Errorf("roles %v: this build of lbd has no datapath manager yet, so it runs the control plane only; leave roles empty", cfg.Roles)
	}
	return cfg, *check, nil
}

func run(ctx context.Context, cfg config.Config, log hclog.Logger) error {
	path := filepath.Join(cfg.StateDir, StateFileName)
	st, err := store.Open(store.Options{
		Path:         path,
		Limits:       cfg.Limits,
		Logger:       log.Named("store"),
		StatusReason: "no datapath: this lbd runs the control plane only",
	})
	if errors.Is(err, store.ErrCorruptState) {
		return fmt.Errorf("%w. %s", err, store.RecoveryHint)
	}
	if err != nil {
		return fmt.Errorf("open state: %w", err)
	}
	defer st.Close()
	svcs, bes := st.Counts()
	log.Info("state restored", "op", "start", "path", path, "services", svcs, "backends", bes)

	var opts []grpc.ServerOption
	var tcpLn net.Listener
	if cfg.API.TCP.Listen != "" {
		tlsCfg, err := serverTLS(cfg.API.TCP)
		if err != nil {
			return err
		}
		if tcpLn, err = net.Listen("tcp", cfg.API.TCP.Listen); err != nil {
			return fmt.Errorf("listen on %s: %w", cfg.API.TCP.Listen, err)
		}
		opts = append(opts, grpc.Creds(credentials.NewTLS(tlsCfg)))
	}
	apiSrv := api.New(api.Options{Store: st, Logger: log.Named("api"), Version: Version, Roles: cfg.Roles})
	opts = append(opts, grpc.ChainStreamInterceptor(apiSrv.StreamInterceptor))
	// The Unix socket needs no TLS: its 0600 mode restricts it to the daemon's user.
	unixSrv := grpc.NewServer(grpc.ChainStreamInterceptor(apiSrv.StreamInterceptor))
	tcpSrv := grpc.NewServer(opts...)
	hs := health.NewServer()
	for _, g := range []*grpc.Server{unixSrv, tcpSrv} {
		apiSrv.Register(g)
		healthpb.RegisterHealthServer(g, hs)
		reflection.Register(g)
	}
	for name := range unixSrv.GetServiceInfo() {
		hs.SetServingStatus(name, healthpb.HealthCheckResponse_SERVING)
	}

	errc := make(chan error, 2)
	if cfg.API.Socket != "" {
		ln, err := listenUnix(cfg.API.Socket)
		if err != nil {
			return err
		}
		defer os.Remove(cfg.API.Socket)
		go func() { errc <- unixSrv.Serve(ln) }()
		log.Info("API listening", "op", "start", "socket", cfg.API.Socket)
	}
	if tcpLn != nil {
		go func() { errc <- tcpSrv.Serve(tcpLn) }()
		log.Info("API listening", "op", "start", "tcp", tcpLn.Addr().String(), "tls", "mutual")
	}
	select {
	case <-ctx.Done():
	case err := <-errc:
		return fmt.Errorf("serve API: %w", err)
	}
	log.Info("shutting down", "op", "stop")
	hs.Shutdown()
	apiSrv.Shutdown()
	done := make(chan struct{})
	go func() {
		unixSrv.GracefulStop()
		tcpSrv.GracefulStop()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(shutdownGrace):
		unixSrv.Stop()
		tcpSrv.Stop()
	}
	return nil
}

// listenUnix listens on a Unix socket created with mode 0600. A stale socket file from
// a crashed daemon is replaced; a live one is an error.
func listenUnix(path string) (net.Listener, error) {
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
	// connect.
	old := syscall.Umask(0o177)
	ln, err := net.Listen("unix", path)
	syscall.Umask(old)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", path, err)
	}
	return ln, nil
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
