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
	"net/netip"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/lbd-dev/lbd/daemon/advertise"
	"github.com/lbd-dev/lbd/daemon/api"
	"github.com/lbd-dev/lbd/daemon/config"
	"github.com/lbd-dev/lbd/daemon/datapath"
	"github.com/lbd-dev/lbd/daemon/healthsync"
	"github.com/lbd-dev/lbd/daemon/metrics"
	"github.com/lbd-dev/lbd/daemon/nexthop"
	"github.com/lbd-dev/lbd/daemon/reconcile"
	"github.com/lbd-dev/lbd/daemon/store"
	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
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

// NeighbourRecordName, in the state directory, records the neighbour entries an LB
// node created for its backend nodes' next hops.
const NeighbourRecordName = "neighbours.json"

// shutdownGrace bounds how long in-flight RPCs may run after SIGTERM.
const shutdownGrace = 10 * time.Second

// errVersion makes Main print the version instead of running; errDetach makes it remove
// the pinned datapath.
var (
	errVersion = errors.New("version requested")
	errDetach  = errors.New("detach requested")
)

// listFlag is a repeatable flag; each use may also hold a comma-separated list.
type listFlag []string

func (l *listFlag) String() string { return strings.Join(*l, ",") }

func (l *listFlag) Set(v string) error {
	for _, s := range strings.Split(v, ",") {
		if s = strings.TrimSpace(s); s != "" {
			*l = append(*l, s)
		}
	}
	return nil
}

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
	if errors.Is(err, errDetach) {
		err := errors.Join(datapath.DetachDir(cfg.Datapath.BPFFSDir),
			datapath.ReleaseNeighbours(context.Background(), filepath.Join(cfg.StateDir, NeighbourRecordName)))
		if err != nil {
			fmt.Fprintf(stderr, "lbd: detach: %v\n", err)
			return 1
		}
		fmt.Fprintf(stdout, "datapath under %s detached\n", cfg.Datapath.BPFFSDir)
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
	role := fs.String("role", "", "roles: lb, backend or both")
	var ifaces, lbSources listFlag
	fs.Var(&ifaces, "interface", "uplink interface (repeatable)")
	fs.Var(&lbSources, "lb-source", "backend role: prefix of LB nodes allowed to send Geneve (repeatable)")
	bpffsDir := fs.String("bpffs-dir", "", "this instance's bpffs directory")
	underlay4 := fs.String("underlay-v4", "", "LB role: outer IPv4 source address")
	underlay6 := fs.String("underlay-v6", "", "LB role: outer IPv6 source address")
	hashSeed := fs.Uint("hash-seed", 0, "flow-hash seed, the same on every LB node")
	ctSize := fs.Uint("conntrack-size", 0, "LB conntrack table size in flows")
	metricsListen := fs.String("metrics-listen", "", "Prometheus /metrics address (empty: off)")
	socketLB := fs.Bool("socket-lb", false, "translate local processes' connections to services at the socket (any role)")
	socketCgroup := fs.String("socket-lb-cgroup", "", "cgroup v2 directory whose processes socket-level load balancing translates (default: the root; implies --socket-lb)")
	detach := fs.Bool("detach", false, "remove the datapath pinned under the bpffs directory and exit")
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
	override("bpffs-dir", &cfg.Datapath.BPFFSDir, *bpffsDir)
	override("underlay-v4", &cfg.Datapath.UnderlayV4, *underlay4)
	override("underlay-v6", &cfg.Datapath.UnderlayV6, *underlay6)
	override("metrics-listen", &cfg.MetricsListen, *metricsListen)
	if set["interface"] {
		cfg.Datapath.Interfaces = ifaces
	}
	if set["lb-source"] {
		cfg.Datapath.LBSources = lbSources
	}
	if set["hash-seed"] {
		if *hashSeed > 1<<32-1 {
			return cfg, false, fmt.Errorf("--hash-seed: %d does not fit 32 bits", *hashSeed)
		}
		cfg.Datapath.HashSeed = uint32(*hashSeed)
	}
	if set["conntrack-size"] {
		if *ctSize > 1<<32-1 {
			return cfg, false, fmt.Errorf("--conntrack-size: %d does not fit 32 bits", *ctSize)
		}
		cfg.Datapath.ConntrackSize = uint32(*ctSize)
	}
	if set["socket-lb"] {
		cfg.Datapath.SocketLB.Enabled = *socketLB
	}
	if set["socket-lb-cgroup"] {
		cfg.Datapath.SocketLB.Enabled = true
		cfg.Datapath.SocketLB.Cgroup = *socketCgroup
	}
	if set["role"] {
		switch *role {
		case "both":
			cfg.Roles = []string{config.RoleLB, config.RoleBackend}
		default:
			cfg.Roles = []string{*role}
		}
	}
	if *detach {
		return cfg, false, errDetach
	}
	if err := cfg.Validate(); err != nil {
		return cfg, false, err
	}
	return cfg, *check, nil
}

func run(ctx context.Context, cfg config.Config, log hclog.Logger) error {
	path := filepath.Join(cfg.StateDir, StateFileName)
	reason := ""
	socketLB := cfg.Datapath.SocketLB.Enabled
	switch {
	case socketLB:
		// Services are programmed here too: socket-level load balancing reads the LB maps.
	case len(cfg.Roles) == 0:
		reason = "no datapath: this lbd runs the control plane only (no --role)"
	case !slices.Contains(cfg.Roles, config.RoleLB):
		reason = "programmed on LB nodes; this node is a backend node"
	}
	// The budget of the services' tables is known once the datapath measured its other
	// maps; until then (and on a node without a datapath) nothing is budgeted.
	var memory atomic.Pointer[store.MemoryBudget]
	st, err := store.Open(store.Options{
		Path:         path,
		Limits:       cfg.Limits,
		Logger:       log.Named("store"),
		StatusReason: reason,
		// A reconciler runs wherever a datapath does: IDs wait for it before reuse.
		HoldIDs: len(cfg.Roles) > 0 || socketLB,
		Memory: func() store.MemoryBudget {
			if b := memory.Load(); b != nil {
				return *b
			}
			return store.MemoryBudget{}
		},
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

	var mgr *datapath.Manager
	var apiDP api.Datapath
	dcfg, err := datapathConfig(cfg)
	if err != nil {
		return err
	}
	dcfg.OnPaths = func(paths map[netip.Addr]nexthop.Path) {
		reach := make(map[netip.Addr]store.NodeReach, len(paths))
		for a, p := range paths {
			reach[a] = store.NodeReach{Reachable: p.Reachable, Reason: p.Reason}
		}
		st.SetNodeReachability(reach)
	}
	// Pinned links left by an earlier daemon mean this start is a restart: BGP then asks
	// its graceful-restart peers to keep our routes until we re-announce them.
	_, statErr := os.Stat(filepath.Join(cfg.Datapath.BPFFSDir, "links"))
	restarting := statErr == nil && len(cfg.Roles) > 0
	if len(cfg.Roles) > 0 || socketLB {
		if mgr, err = datapath.Open(dcfg, log.Named("datapath")); err != nil {
			return fmt.Errorf("open datapath: %w", err)
		}
		// Closing keeps the pinned programs forwarding: a restart drops nothing.
		defer mgr.Close()
		apiDP = mgr
		b, err := memoryBudget(cfg, mgr)
		if err != nil {
			return err
		}
		// Only the LB maps hold tables: a backend node's services cost it nothing.
		if dcfg.LB || dcfg.SocketLB {
			memory.Store(&b)
		}
		log.Info("memory budget", "op", "start", "total", b.Total, "maps", b.Total-b.Tables, "tables", b.Tables)
	}
	if mgr == nil {
		// Hooks a previous configuration attached must not keep translating.
		err := datapath.DetachSocketLB(cfg.Datapath.BPFFSDir, log.Named("datapath"))
		if errors.Is(err, os.ErrPermission) {
			// An unprivileged control plane cannot have attached any.
			log.Warn("cannot look for socket-level hooks to detach", "op", "start", "error", err)
		} else if err != nil {
			return fmt.Errorf("detach socket-level load balancing: %w", err)
		}
	}
	// ready is what gRPC health, /readyz and the BGP advertiser say of the node.
	ready := func() (bool, string) {
		if mgr == nil {
			return true, "no datapath: this lbd runs the control plane only"
		}
		return mgr.Ready()
	}
	var met *metrics.Metrics
	if mgr != nil {
		met = metrics.New(func() (*lbdv1.GetStatsResponse, error) { return mgr.GetStats(ctx, nil) },
			map[string]uint32{"conntrack": cfg.Datapath.ConntrackSize, "nat": cfg.Datapath.NATSize})
	} else {
		met = metrics.New(nil, nil)
	}
	met.AddStatus(func() []*lbdv1.Service { return st.ListServices("") })
	met.SetReady(ready)
	if mgr != nil {
		met.AddDrift(mgr.DriftCounts)
	}
	if cfg.MetricsListen != "" {
		go func() {
			if err := met.Serve(ctx, cfg.MetricsListen, log.Named("metrics")); err != nil {
				log.Error("metrics listener failed", "op", "metrics", "error", err)
			}
		}()
	}
	var adv *advertise.Controller
	defer func() {
		// A plain stop leaves graceful-restart sessions to the process exit (package
		// advertise); a detached node stops advertising for good.
		if adv != nil && (mgr == nil || !mgr.Attached()) {
			wctx, wcancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer wcancel()
			if err := adv.Withdraw(wctx); err != nil {
				log.Error("withdraw BGP routes", "op", "bgp", "error", err)
			}
		}
	}()
	// Workers stop before the datapath handles close (defers run last-in first-out).
	ctx, cancel := context.WithCancel(ctx)
	var workers sync.WaitGroup
	defer workers.Wait()
	defer cancel()
	if mgr != nil {
		rec := reconcile.New(st, mgr, log.Named("reconcile"))
		rec.Observe = met.ObserveReconcile
		workers.Add(4)
		go func() {
			defer workers.Done()
			if err := rec.Run(ctx); err != nil {
				log.Error("reconciler stopped", "op", "reconcile", "error", err)
			}
		}()
		go func() {
			defer workers.Done()
			mgr.RunGC(ctx, met.ObserveGC)
		}()
		go func() {
			defer workers.Done()
			mgr.RunVerify(ctx)
		}()
		go func() {
			defer workers.Done()
			if err := mgr.RunNextHops(ctx); err != nil {
				log.Error("next-hop tracking stopped", "op", "nexthop", "error", err)
			}
		}()
		// Nodes that choose backends (LB nodes, socket-level load balancing) probe them;
		// each probes for itself and, seeing the same backends, converges on the same
		// tables.
		if dcfg.LB || dcfg.SocketLB {
			workers.Add(1)
			go func() {
				defer workers.Done()
				healthsync.Run(ctx, st, healthsync.Options{Logger: log.Named("health")})
			}()
		}
	}

	var apiBGP api.BGP
	if cfg.BGP != nil {
		// A VIP is advertised only while this node forwards it: attached, and the maps
		// in line with the desired state.
		attached := func() bool {
			ok, _ := ready()
			return mgr != nil && ok
		}
		if adv, err = advertise.New(*cfg.BGP, st, attached, restarting, log.Named("bgp")); err != nil {
			return fmt.Errorf("bgp: %w", err)
		}
		apiBGP = adv // only when non-nil: a nil *Controller in the interface is not nil
		met.AddBGP(adv.Metrics)
		workers.Add(1)
		go func() {
			defer workers.Done()
			if err := adv.Run(ctx); err != nil {
				log.Error("BGP advertisement stopped", "op", "bgp", "error", err)
			}
		}()
	}

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
	apiSrv := api.New(api.Options{Store: st, Logger: log.Named("api"), Version: Version, Roles: cfg.Roles, Datapath: apiDP, BGP: apiBGP,
		MaxWatchers: cfg.API.MaxWatchers, WatchBacklog: cfg.WatchBacklogOrDefault()})
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
	workers.Add(1)
	go func() {
		defer workers.Done()
		serveHealth(ctx, hs, unixSrv, ready)
	}()

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

// healthPoll is how often gRPC health follows the node's readiness.
const healthPoll = 500 * time.Millisecond

// serveHealth keeps grpc.health.v1 in line with the node's readiness until ctx ends:
// SERVING for the whole server ("") and every service while ready, NOT_SERVING while
// the datapath is detached or not yet in line with the desired state.
func serveHealth(ctx context.Context, hs *health.Server, srv *grpc.Server, ready func() (bool, string)) {
	names := []string{""}
	for name := range srv.GetServiceInfo() {
		names = append(names, name)
	}
	t := time.NewTicker(healthPoll)
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
		}
	}
}
