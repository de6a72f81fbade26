// Package lbd is the lbd daemon's entry point: flags and configuration, logging, the
// desired-state store, and the gRPC API on a Unix socket and an optional mutual-TLS TCP
// listener.
package lbd

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/lbd-dev/lbd/daemon/config"
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
