package lbd

import (
	"flag"
	"fmt"
	"io"
	"strings"

	"github.com/lbd-dev/lbd/daemon/config"
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

// flagValues are the values of lbd's flags once parsed.
type flagValues struct {
	cfgPath           *string
	check             *bool
	version           *bool
	logLevel          *string
	logJSON           *bool
	stateDir          *string
	socket            *string
	listen            *string
	cert              *string
	key               *string
	ca                *string
	role              *string
	bpffsDir          *string
	underlay4         *string
	underlay6         *string
	hashSeed          *uint
	ctSize            *uint
	metricsListen     *string
	socketLB          *bool
	socketCgroup      *string
	detach            *bool
	ifaces, lbSources listFlag
}

// FlagSet returns lbd's command-line flags, for its manual page and documentation
// checks; Main parses the same set.
func FlagSet() *flag.FlagSet {
	fs, _ := newFlagSet(io.Discard)
	return fs
}

// newFlagSet defines lbd's flags; usage and errors go to stderr.
func newFlagSet(stderr io.Writer) (*flag.FlagSet, *flagValues) {
	fs := flag.NewFlagSet("lbd", flag.ContinueOnError)
	fs.SetOutput(stderr)
	v := &flagValues{}
	v.cfgPath = fs.String("config", "", "configuration file (YAML; see examples/lbd.yaml)")
	v.check = fs.Bool("check-config", false, "validate the configuration, check that its interfaces exist on this host and its addresses are assigned here, and exit")
	v.version = fs.Bool("version", false, "print the version and exit")
	v.logLevel = fs.String("log-level", "", "log level: trace, debug, info, warn, error (overrides the file)")
	v.logJSON = fs.Bool("log-json", false, "log JSON lines (overrides the file)")
	v.stateDir = fs.String("state-dir", "", "directory of the desired-state file (overrides the file)")
	v.socket = fs.String("socket", "", "Unix socket of the API (overrides the file)")
	v.listen = fs.String("listen", "", "TCP address of the mutual-TLS API listener (overrides the file)")
	v.cert = fs.String("tls-cert", "", "server certificate for the TCP listener")
	v.key = fs.String("tls-key", "", "server key for the TCP listener")
	v.ca = fs.String("tls-client-ca", "", "CA that client certificates must chain to")
	v.role = fs.String("role", "", "roles: lb, backend or both")
	fs.Var(&v.ifaces, "interface", "uplink interface (repeatable)")
	fs.Var(&v.lbSources, "lb-source", "backend role: prefix of LB nodes allowed to send Geneve (repeatable)")
	v.bpffsDir = fs.String("bpffs-dir", "", "this instance's bpffs directory")
	v.underlay4 = fs.String("underlay-v4", "", "LB role: outer IPv4 source address")
	v.underlay6 = fs.String("underlay-v6", "", "LB role: outer IPv6 source address")
	v.hashSeed = fs.Uint("hash-seed", 0, "flow-hash seed, the same on every LB node")
	v.ctSize = fs.Uint("conntrack-size", 0, "LB conntrack table size in flows")
	v.metricsListen = fs.String("metrics-listen", "", "Prometheus /metrics address (empty: off)")
	v.socketLB = fs.Bool("socket-lb", false, "translate local processes' connections to services at the socket (any role)")
	v.socketCgroup = fs.String("socket-lb-cgroup", "", "cgroup v2 directory whose processes socket-level load balancing translates (default: the root; implies --socket-lb)")
	v.detach = fs.Bool("detach", false, "remove the datapath pinned under the bpffs directory and exit")
	return fs, v
}

func parseFlags(args []string, stderr io.Writer) (config.Config, bool, error) {
	fs, v := newFlagSet(stderr)
	if err := fs.Parse(args); err != nil {
		return config.Config{}, false, err
	}
	if fs.NArg() > 0 {
		return config.Config{}, false, fmt.Errorf("unexpected arguments: %s", strings.Join(fs.Args(), " "))
	}
	if *v.version {
		return config.Config{}, false, errVersion
	}
	cfg := config.Default()
	if *v.cfgPath != "" {
		var err error
		if cfg, err = config.Load(*v.cfgPath); err != nil {
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
	override("log-level", &cfg.Log.Level, *v.logLevel)
	override("state-dir", &cfg.StateDir, *v.stateDir)
	override("socket", &cfg.API.Socket, *v.socket)
	override("listen", &cfg.API.TCP.Listen, *v.listen)
	override("tls-cert", &cfg.API.TCP.CertFile, *v.cert)
	override("tls-key", &cfg.API.TCP.KeyFile, *v.key)
	override("tls-client-ca", &cfg.API.TCP.ClientCAFile, *v.ca)
	if set["log-json"] {
		cfg.Log.JSON = *v.logJSON
	}
	override("bpffs-dir", &cfg.Datapath.BPFFSDir, *v.bpffsDir)
	override("underlay-v4", &cfg.Datapath.UnderlayV4, *v.underlay4)
	override("underlay-v6", &cfg.Datapath.UnderlayV6, *v.underlay6)
	override("metrics-listen", &cfg.MetricsListen, *v.metricsListen)
	if set["interface"] {
		cfg.Datapath.Interfaces = v.ifaces
	}
	if set["lb-source"] {
		cfg.Datapath.LBSources = v.lbSources
	}
	if set["hash-seed"] {
		if *v.hashSeed > 1<<32-1 {
			return cfg, false, fmt.Errorf("--hash-seed: %d does not fit 32 bits", *v.hashSeed)
		}
		cfg.Datapath.HashSeed = uint32(*v.hashSeed)
	}
	if set["conntrack-size"] {
		if *v.ctSize > 1<<32-1 {
			return cfg, false, fmt.Errorf("--conntrack-size: %d does not fit 32 bits", *v.ctSize)
		}
		cfg.Datapath.ConntrackSize = uint32(*v.ctSize)
	}
	if set["socket-lb"] {
		cfg.Datapath.SocketLB.Enabled = *v.socketLB
	}
	if set["socket-lb-cgroup"] {
		cfg.Datapath.SocketLB.Enabled = true
		cfg.Datapath.SocketLB.Cgroup = *v.socketCgroup
	}
	if set["role"] {
		switch *v.role {
		case "both":
			cfg.Roles = []string{config.RoleLB, config.RoleBackend}
		default:
			cfg.Roles = []string{*v.role}
		}
	}
	if *v.detach {
		return cfg, false, errDetach
	}
	if err := cfg.Validate(); err != nil {
		return cfg, false, err
	}
	return cfg, *v.check, nil
}
