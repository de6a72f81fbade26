package lbd

import (
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/lbd-dev/lbd/daemon/config"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
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

// Type names the flag's kind in the help.
func (l *listFlag) Type() string { return "list" }

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

// Command returns lbd's command line (cobra, as lbctl's), for its manual page and the
// documentation checks; Main parses the same flags.
func Command() *cobra.Command {
	cmd, _ := newCommand(io.Discard)
	return cmd
}

// newCommand defines lbd's command and flags; help and errors go to out.
func newCommand(out io.Writer) (*cobra.Command, *flagValues) {
	cmd := &cobra.Command{
		Use:   "lbd [flags]",
		Short: "the lbd layer-4 load-balancer daemon",
		Long: `lbd is the lbd load-balancer daemon: an LB node (--role lb) balances VIP traffic in
XDP and sends it Geneve-encapsulated to backend nodes (--role backend), which send the
replies straight to the clients. The configuration file (--config) holds every
setting; the flags override it.`,
		Args:          cobra.NoArgs,
		SilenceErrors: true,
		SilenceUsage:  true,
		RunE:          func(*cobra.Command, []string) error { return nil },
	}
	cmd.SetOut(out)
	cmd.SetErr(out)
	fs := cmd.Flags()
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
	// cobra's own version flag would shadow lbd's --version; its help flag is -h, --help.
	cmd.Flags().BoolP("help", "h", false, "print this help and exit")
	return cmd, v
}

// errHelp makes Main print the help and exit 0.
var errHelp = errors.New("help requested")

// longFlags turns a single-dash long flag (-config, -check-config=x), which lbd took
// before its flags moved to cobra, into the double-dash form; "-h" stays the short help.
func longFlags(fs *pflag.FlagSet, args []string) []string {
	out := make([]string, 0, len(args))
	for i, a := range args {
		if a == "--" {
			return append(out, args[i:]...)
		}
		if len(a) > 2 && a[0] == '-' && a[1] != '-' {
			name, _, _ := strings.Cut(a[1:], "=")
			if fs.Lookup(name) != nil {
				a = "-" + a
			}
		}
		out = append(out, a)
	}
	return out
}

func parseFlags(args []string, stdout io.Writer) (config.Config, bool, error) {
	cmd, v := newCommand(stdout)
	fs := cmd.Flags()
	if err := fs.Parse(longFlags(fs, args)); err != nil {
		return config.Config{}, false, err
	}
	if help, _ := fs.GetBool("help"); help {
		// Help to stdout, as lbctl's.
		return config.Config{}, false, errors.Join(errHelp, cmd.Help())
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
	fs.Visit(func(f *pflag.Flag) { set[f.Name] = true })
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
