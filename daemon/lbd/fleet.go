package lbd

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/lbd-dev/lbd/daemon/api"
	"github.com/lbd-dev/lbd/daemon/config"
	"github.com/lbd-dev/lbd/daemon/datapath"
	"github.com/lbd-dev/lbd/daemon/etcdstore"
	"github.com/lbd-dev/lbd/daemon/fleet"
	"github.com/lbd-dev/lbd/daemon/fleetsync"
	"github.com/lbd-dev/lbd/daemon/store"
	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
)

// tablesOf is the datapath whose tables the fleet RPCs digest: a node's that programs
// services (LB role, socket-level load balancing), nil on others.
func tablesOf(dp *openingDatapath, dcfg datapath.Config) api.Tables {
	if !(dcfg.LB || dcfg.SocketLB) {
		return nil
	}
	return dp
}

// TableDigests implements api.Tables.
func (d *openingDatapath) TableDigests() (map[string]string, error) {
	m, err := d.manager()
	if err != nil {
		return nil, err
	}
	return m.TableDigests()
}

// openFleet connects to the fleet's etcd store when the configuration says so: the
// store then writes every change of services there first (store.Options.Shared), and
// the returned Sync follows the fleet. nil, nil with the file store.
func openFleet(cfg config.Config, log hclog.Logger) (*fleetsync.Sync, *etcdstore.Client, error) {
	if cfg.Store.Type != config.StoreEtcd {
		return nil, nil, nil
	}
	c := cfg.Store
	cli, err := etcdstore.Open(etcdstore.Options{Endpoints: c.Endpoints, Prefix: c.Prefix,
		CAFile: c.TLS.CAFile, CertFile: c.TLS.CertFile, KeyFile: c.TLS.KeyFile,
		Timeout: time.Duration(c.Timeout), Logger: log.Named("etcd")})
	if err != nil {
		return nil, nil, fmt.Errorf("store: %w", err)
	}
	log.Info("services in the fleet's etcd store", "op", "start", "endpoints", strings.Join(c.Endpoints, ","), "prefix", c.Prefix)
	return fleetsync.New(fleetsync.Options{Client: cli, HashSeed: cfg.Datapath.HashSeed, Logger: log.Named("fleet")}), cli, nil
}

// nodeName is this node's name in the fleet: store.node_name, else the host name.
func nodeName(cfg config.Config) (string, error) {
	if cfg.Store.NodeName != "" {
		return cfg.Store.NodeName, nil
	}
	h, err := os.Hostname()
	if err != nil || h == "" {
		return "", fmt.Errorf("store.node_name: not set, and the host name is unknown (%v)", err)
	}
	return h, nil
}

// registration is what this node tells its fleet about itself: version, readiness and,
// once its datapath is open on a node that programs services, the digests of what its
// maps hold.
func registration(st *store.Store, dp *openingDatapath, programs bool, ready func() (bool, string), log hclog.Logger) fleetsync.Registration {
	return func() *lbdv1.FleetNode {
		ok, reason := ready()
		n := &lbdv1.FleetNode{Version: Version, Ready: ok, ReadyReason: reason}
		m := dp.m.Load()
		if !programs || m == nil {
			return n
		}
		tables, err := m.TableDigests()
		if err != nil {
			log.Warn("read the datapath's digests", "op", "fleet", "error", err)
			return n
		}
		n.ProgramsServices, n.Digests = true, fleet.Digests(st.ListServices(""), tables)
		return n
	}
}

// runFleet follows the fleet and keeps this node registered until ctx ends; a seed
// that is not the fleet's is sent to errc.
func runFleet(ctx context.Context, workers *sync.WaitGroup, fs *fleetsync.Sync, st *store.Store, name string, reg fleetsync.Registration, errc chan<- error, log hclog.Logger) {
	workers.Go(func() {
		if err := fs.Run(ctx, st); err != nil {
			errc <- err
		}
	})
	workers.Go(func() {
		if err := fs.RunRegistration(ctx, name, reg); err != nil {
			log.Error("fleet registration stopped", "op", "fleet", "error", err)
		}
	})
}
