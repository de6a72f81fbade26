package lbd

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
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
