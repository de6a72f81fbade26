// Package adapter is the lbd-k8s-adapter command: flags, configuration, clients, signals.
package adapter

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"syscall"

	"github.com/lbd-dev/lbd/cmd/lbd-k8s-adapter/internal/config"
	"github.com/lbd-dev/lbd/cmd/lbd-k8s-adapter/internal/controller"
	"github.com/lbd-dev/lbd/cmd/lbd-k8s-adapter/internal/nodeconfig"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"
)

// Main runs the adapter with the command-line arguments until SIGINT or SIGTERM and
// returns the exit code.
func Main(args []string, stderr io.Writer) int {
	// client-go logs through klog (leader election, watch errors): give it the same format.
	// Set here, once per process, because it is global.
	klog.SetSlogLogger(slog.New(slog.NewTextHandler(stderr, nil)))
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	return Run(ctx, args, stderr)
}

// Run is Main until ctx is done.
func Run(ctx context.Context, args []string, stderr io.Writer) int {
	if len(args) > 0 && args[0] == "node-config" {
		return nodeConfig(args[1:], stderr)
	}
	fs := flag.NewFlagSet("lbd-k8s-adapter", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage: lbd-k8s-adapter [flags]\n       lbd-k8s-adapter node-config --template FILE --out FILE\n\nFlags:\n")
		fs.PrintDefaults()
	}
	cfgPath := fs.String("config", "/etc/lbd/k8s-adapter.yaml", "configuration file (YAML)")
	kubeconfig := fs.String("kubeconfig", "", "kubeconfig file (overrides the config file; default: in-cluster)")
	identity := fs.String("identity", "", "name of this replica in the leader Lease and in Events (default: $NODE_NAME, else $POD_NAME, else the host name)")
	level := fs.String("log-level", "info", "debug, info, warn or error")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "lbd-k8s-adapter: unexpected arguments %q\n", fs.Args())
		return 2
	}
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(*level)); err != nil {
		fmt.Fprintf(stderr, "lbd-k8s-adapter: --log-level: %v\n", err)
		return 2
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: lvl}))
	if err := run(ctx, *cfgPath, *kubeconfig, *identity, log); err != nil {
		log.Error("adapter failed", "op", "run", "err", err)
		return 1
	}
	return 0
}

func run(ctx context.Context, cfgPath, kubeconfig, identity string, log *slog.Logger) error {
	cfg, err := config.Load(cfgPath)
	if err != nil {
		return err
	}
	if kubeconfig != "" {
		cfg.Kubeconfig = kubeconfig
	}
	var rc *rest.Config
	if cfg.Kubeconfig != "" {
		rc, err = clientcmd.BuildConfigFromFlags("", cfg.Kubeconfig)
	} else {
		rc, err = rest.InClusterConfig()
	}
	if err != nil {
		return fmt.Errorf("load kubernetes client config: %w", err)
	}
	rc.UserAgent = "lbd-k8s-adapter"
	rc.QPS, rc.Burst = cfg.KubeClient.QPS, cfg.KubeClient.Burst
	kube, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return fmt.Errorf("create kubernetes client: %w", err)
	}
	// Events get a client and a rate budget of their own (see config.KubeClient).
	erc := rest.CopyConfig(rc)
	erc.QPS, erc.Burst = cfg.KubeClient.EventQPS, cfg.KubeClient.EventBurst
	events, err := kubernetes.NewForConfig(erc)
	if err != nil {
		return fmt.Errorf("create kubernetes client for events: %w", err)
	}
	if identity == "" {
		identity = os.Getenv("NODE_NAME")
	}
	if identity == "" {
		identity = os.Getenv("POD_NAME")
	}
	if identity == "" {
		if identity, err = os.Hostname(); err != nil {
			return fmt.Errorf("get host name for --identity: %w", err)
		}
	}
	conn, err := controller.DialLbd(cfg.LbdAddress)
	if err != nil {
		return err
	}
	defer conn.Close()
	health := controller.NewHealth()
	if cfg.HealthListen != "" {
		ln, err := net.Listen("tcp", cfg.HealthListen)
		if err != nil {
			return fmt.Errorf("listen for probes on %s: %w", cfg.HealthListen, err)
		}
		go func() {
			if err := health.Serve(ctx, ln); err != nil {
				log.Error("probes stopped", "op", "health", "err", err)
			}
		}()
	}
	log.Info("starting", "op", "start", "owner", cfg.Owner, "lbd", cfg.LbdAddress, "identity", identity, "class", cfg.LoadBalancerClass,
		"qps", cfg.KubeClient.QPS, "burst", cfg.KubeClient.Burst)
	return controller.Run(ctx, controller.Options{Config: cfg, Kube: kube, Events: events, Lbd: conn, Identity: identity, Log: log, Health: health})
}

// nodeConfig is the node-config command: it renders a configuration template with the
// node's name and addresses from the downward API (NODE_NAME, NODE_IPS), for an init
// container that writes lbd's per-node configuration.
func nodeConfig(args []string, stderr io.Writer) int {
	fs := flag.NewFlagSet("lbd-k8s-adapter node-config", flag.ContinueOnError)
	fs.SetOutput(stderr)
	in := fs.String("template", "", "template file: ${NODE_NAME}, ${NODE_IPV4} and ${NODE_IPV6} are replaced")
	out := fs.String("out", "", "file to write")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *in == "" || *out == "" || fs.NArg() > 0 {
		fmt.Fprintln(stderr, "lbd-k8s-adapter node-config: need --template and --out, and no other arguments")
		return 2
	}
	node, err := nodeconfig.FromEnv(os.Getenv)
	if err == nil {
		err = nodeconfig.RenderFile(*in, *out, node)
	}
	if err != nil {
		fmt.Fprintf(stderr, "lbd-k8s-adapter node-config: %v\n", err)
		return 1
	}
	return 0
}
