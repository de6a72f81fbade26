// Package lbd is the lbd daemon's entry point: flags and configuration, logging, the
// desired-state store, and the gRPC API on a Unix socket and an optional mutual-TLS TCP
// listener.
package lbd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/lbd-dev/lbd/daemon/datapath"
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

// Main runs the daemon and returns its exit code.
func Main(args []string, stdout, stderr io.Writer) int {
	cfg, check, err := parseFlags(args, stdout)
	if errors.Is(err, errVersion) {
		fmt.Fprintln(stdout, "lbd", Version)
		return 0
	}
	if errors.Is(err, errHelp) {
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
		if err := checkHost(cfg); err != nil {
			fmt.Fprintf(stderr, "lbd: configuration does not fit this host:\n%v\n", err)
			return 2
		}
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
