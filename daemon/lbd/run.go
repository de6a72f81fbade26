package lbd

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
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
	"github.com/lbd-dev/lbd/daemon/monitor"
	"github.com/lbd-dev/lbd/daemon/nexthop"
	"github.com/lbd-dev/lbd/daemon/reconcile"
	"github.com/lbd-dev/lbd/daemon/sdnotify"
	"github.com/lbd-dev/lbd/daemon/store"
)

// run starts lbd and serves until ctx ends. The API listens as soon as the state is
// restored, before the datapath is open: at a restart with thousands of services the
// desired state can be read and drained at once, while the pinned maps are adopted and
// checked (the node is ready only once they hold the desired state).
func run(ctx context.Context, cfg config.Config, log hclog.Logger) error {
	notifier, err := sdnotify.New(log.Named("systemd"))
	if err != nil {
		return err
	}
	stopped := &stoppedLoops{} // loops that ended before shutdown: the watchdog goes unfed
	path := filepath.Join(cfg.StateDir, StateFileName)
	reason := ""
	socketLB := cfg.Datapath.SocketLB.Enabled
	withDatapath := len(cfg.Roles) > 0 || socketLB
	switch {
	case socketLB:
		// Services are programmed here too: socket-level load balancing reads the LB maps.
	case len(cfg.Roles) == 0:
		reason = "no datapath: this lbd runs the control plane only (no --role)"
	case !slices.Contains(cfg.Roles, config.RoleLB):
		reason = "programmed on LB nodes; this node is a backend node"
	}
	dcfg, err := datapathConfig(cfg)
	if err != nil {
		return err
	}
	// Only the LB maps hold tables: a backend node's services cost it nothing. Their
	// budget is known once the datapath measured its other maps; until then a change
	// that would add table memory waits.
	budgeted := dcfg.LB || dcfg.SocketLB
	var memory atomic.Pointer[store.MemoryBudget]
	fs, etcdCli, err := openFleet(cfg, log)
	if err != nil {
		return err
	}
	var shared store.Shared
	var name string
	if fs != nil {
		defer etcdCli.Close()
		shared = fs
		if name, err = nodeName(cfg); err != nil {
			return err
		}
	}
	st, err := store.Open(store.Options{
		Shared:       shared,
		Path:         path,
		Limits:       cfg.Limits,
		Logger:       log.Named("store"),
		StatusReason: reason,
		// A reconciler runs wherever a datapath does: IDs wait for it before reuse.
		HoldIDs: withDatapath,
		Memory: func() store.MemoryBudget {
			if b := memory.Load(); b != nil {
				return *b
			}
			if budgeted {
				return store.MemoryBudget{Unknown: openingReason + ": the memory budget of the Maglev tables is known once its maps are"}
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
	if !withDatapath {
		// Hooks a previous configuration attached must not keep translating.
		err := datapath.DetachSocketLB(cfg.Datapath.BPFFSDir, log.Named("datapath"))
		if errors.Is(err, os.ErrPermission) {
			// An unprivileged control plane cannot have attached any.
			log.Warn("cannot look for socket-level hooks to detach", "op", "start", "error", err)
		} else if err != nil {
			return fmt.Errorf("detach socket-level load balancing: %w", err)
		}
	}
	dp := &openingDatapath{}
	// ready is what gRPC health, /readyz and the BGP advertiser say of the node.
	ready := func() (bool, string) {
		if !withDatapath {
			return true, "no datapath: this lbd runs the control plane only"
		}
		return dp.Ready()
	}
	var opening *openingDatapath // nil on a node without a datapath
	if withDatapath {
		opening = dp
	}
	met, err := newMetrics(cfg, opening, st, ready, log.Named("metrics"))
	if err != nil {
		return err
	}
	if cfg.MetricsListen != "" {
		go func() {
			if err := met.Serve(ctx, cfg.MetricsListen, log.Named("metrics")); err != nil {
				log.Error("metrics listener failed", "op", "metrics", "error", err)
			}
		}()
	}

	ctx, cancel := context.WithCancel(ctx)
	var workers sync.WaitGroup
	var mgr *datapath.Manager // once open
	var adv *advertise.Controller
	defer func() {
		// Workers stop before the datapath's handles close. A plain stop leaves
		// graceful-restart sessions to the process exit (package advertise); a detached
		// node stops advertising for good. Closing keeps the pinned programs forwarding:
		// a restart drops nothing.
		cancel()
		workers.Wait()
		if adv != nil && (mgr == nil || !mgr.Attached()) {
			wctx, wcancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer wcancel()
			if err := adv.Withdraw(wctx); err != nil {
				log.Error("withdraw BGP routes", "op", "bgp", "error", err)
			}
		}
		if mgr != nil {
			mgr.Close()
		}
	}()

	var apiBGP api.BGP
	if cfg.BGP != nil {
		// A VIP is advertised only while this node forwards it: attached, and the maps
		// in line with the desired state.
		attached := func() bool {
			ok, _ := ready()
			return withDatapath && ok
		}
		if adv, err = advertise.New(*cfg.BGP, st, attached, restarting, log.Named("bgp")); err != nil {
			return fmt.Errorf("bgp: %w", err)
		}
		apiBGP = adv // only when non-nil: a nil *Controller in the interface is not nil
		met.AddBGP(adv.Metrics)
	}
	// The speaker starts once the datapath is open (at once without one). Started
	// earlier, a session that comes up while the pinned maps are still being adopted
	// would end a graceful restart with no route (nothing is ready to advertise yet):
	// the peers would drop this node's stale routes and move its flows to the other LB
	// nodes in the middle of the restart.
	startBGP := func() {
		if adv == nil {
			return
		}
		workers.Go(func() {
			if err := adv.Run(ctx); err != nil {
				log.Error("BGP advertisement stopped", "op", "bgp", "error", err)
				stopped.add("BGP advertisement", err)
			}
		})
	}
	if !withDatapath {
		startBGP()
	}

	apiOpts := api.Options{Store: st, Logger: log.Named("api"), Version: Version, Roles: cfg.Roles, BGP: apiBGP,
		MaxWatchers: cfg.API.MaxWatchers, WatchBacklog: cfg.WatchBacklogOrDefault(), Tables: tablesOf(dp, dcfg)}
	if withDatapath {
		apiOpts.Datapath = dp
	}
	if dcfg.LB || dcfg.Backend {
		apiOpts.Monitor = monitor.New(dp, monitor.Options{Reasons: datapath.MonitorReasons(dcfg.LB, dcfg.Backend), Logger: log.Named("monitor")})
	}
	sec, err := newSecurity(cfg.API, st, met, log)
	if err != nil {
		return err
	}
	defer sec.close()
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	workers.Go(func() { sec.run(ctx, hup) })
	fleetErr := make(chan error, 1)
	if fs != nil {
		apiOpts.Fleet = fs
		met.AddFleet(fs.Diverged)
	}
	srv, err := startAPI(cfg.API, api.New(apiOpts), sec, log)
	if err != nil {
		return err
	}
	if fs != nil {
		// The node serves its copy of the fleet's services from the start; the fleet's
		// own replace them as soon as etcd answers.
		runFleet(ctx, &workers, fs, st, name, registration(st, dp, dcfg.LB || dcfg.SocketLB, ready, log), fleetErr, log)
	}
	defer srv.remove()
	// readyChanged wakes serveHealth when the first sync is done: a restarted node says
	// so at once rather than at its next look.
	readyChanged := make(chan struct{}, 1)
	workers.Add(1)
	go func() {
		defer workers.Done()
		serveHealth(ctx, srv.health, srv.unix, ready, readyChanged, healthPoll)
	}()
	workers.Go(func() { notifySystemd(ctx, notifier, log.Named("systemd"), ready, st, stopped, cfg.API.Socket) })

	if withDatapath {
		start := time.Now()
		if mgr, err = datapath.Open(dcfg, log.Named("datapath")); err != nil {
			srv.stop(0)
			return fmt.Errorf("open datapath: %w", err)
		}
		b, err := memoryBudget(cfg, mgr)
		if err != nil {
			srv.stop(0)
			return err
		}
		if budgeted {
			memory.Store(&b)
		}
		log.Info("memory budget", "op", "start", "total", b.Total, "maps", b.Total-b.Tables, "tables", b.Tables)
		dp.set(mgr)
		log.Info("datapath open", "op", "start", "took", time.Since(start))
		startWorkers(ctx, &workers, st, mgr, met, dcfg.LB || dcfg.SocketLB, stopped, log)
		workers.Go(func() {
			select {
			case <-mgr.Synced():
				readyChanged <- struct{}{}
			case <-ctx.Done():
			}
		})
		startBGP()
	}

	select {
	case <-ctx.Done():
	case err := <-srv.errc:
		return fmt.Errorf("serve API: %w", err)
	case err := <-fleetErr:
		srv.stop(shutdownGrace)
		return err
	}
	log.Info("shutting down", "op", "stop")
	srv.stop(shutdownGrace)
	return nil
}

// startWorkers starts what keeps the datapath in line with the desired state: the
// reconciler, garbage collection, verification, next hops, and on nodes that choose
// backends (LB nodes, socket-level load balancing) the health checks: each node probes
// for itself and, seeing the same backends, converges on the same tables.
func startWorkers(ctx context.Context, workers *sync.WaitGroup, st *store.Store, mgr *datapath.Manager, met *metrics.Metrics, probes bool, stopped *stoppedLoops, log hclog.Logger) {
	rec := reconcile.New(st, mgr, log.Named("reconcile"))
	rec.Observe = met.ObserveReconcile
	workers.Go(func() {
		if err := rec.Run(ctx); err != nil {
			log.Error("reconciler stopped", "op", "reconcile", "error", err)
			stopped.add("reconciler", err)
		}
	})
	workers.Go(func() { mgr.RunGC(ctx, met.ObserveGC) })
	workers.Go(func() { mgr.RunVerify(ctx) })
	workers.Go(func() {
		if err := mgr.RunNextHops(ctx); err != nil {
			log.Error("next-hop tracking stopped", "op", "nexthop", "error", err)
			stopped.add("next-hop tracking", err)
		}
	})
	if probes {
		workers.Go(func() { healthsync.Run(ctx, st, healthsync.Options{Logger: log.Named("health")}) })
	}
}
