// Package lbctl is lbctl, the operator's command line for lbd. Each command turns its flags
// into one or two calls of lbd's gRPC API and prints the answer as a table, JSON or YAML.
//
// Output is buffered and written only when the command succeeds, so a failing command
// never leaves half a table or half a JSON document on stdout.
package lbctl

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"runtime/debug"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
)

// Version is lbctl's own version, set at link time:
//
//	go build -ldflags "-X github.com/lbd-dev/lbd/lbctl.Version=v1.2.3" ./cmd/lbctl
//
// When empty, the module version recorded in the binary is used.
var Version = ""

// Exit codes returned by Main.
const (
	ExitOK    = 0
	ExitError = 1 // the command ran and failed: server error, unreachable server, ...
	ExitUsage = 2 // the command line is wrong: unknown command, bad flag or argument
)

const (
	defaultServer  = "unix:///run/lbd/lbd.sock"
	serverEnv      = "LBCTL_SERVER"
	defaultTimeout = 10 * time.Second
)

// Main runs lbctl with args (the program name excluded) and returns the process exit code.
// Results go to stdout only if the command succeeds (or, for a check that found a
// problem, with the report of what it found); errors go to stderr as
// "lbctl: <message> (code: <gRPC code>)".
func Main(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	a := &app{stdin: stdin, stdout: stdout, now: time.Now}
	root := a.rootCommand(stderr)
	root.SetArgs(args)
	cmd, err := root.ExecuteC()
	if a.conn != nil {
		// Closing only releases the connection; every RPC has already returned.
		_ = a.conn.Close()
	}
	var found *findings
	if err != nil && !errors.As(err, &found) {
		return a.report(stderr, cmd, err)
	}
	if _, err := stdout.Write(a.out.Bytes()); err != nil {
		fmt.Fprintf(stderr, "lbctl: write output: %v\n", err)
		return ExitError
	}
	if found != nil {
		fmt.Fprintf(stderr, "lbctl: %v\n", found)
		return ExitError
	}
	return ExitOK
}

// app is the state of one lbctl run.
type app struct {
	opts   globalOptions
	stdin  io.Reader
	stdout io.Writer
	now    func() time.Time
	// out collects stdout until the command has succeeded; a watch (-w) flushes it
	// after every change instead.
	out bytes.Buffer
	// watching is set by -w: the command follows changes until interrupted.
	watching bool
	// waiting is set by --wait: the command waits for its change to take effect.
	waiting bool
	// started is set once a command's own code runs: errors before that are usage errors
	// found by cobra (unknown command, bad flag, wrong number of arguments).
	started bool
	conn    *grpc.ClientConn
}

// usageError is a mistake in the command line; it exits with ExitUsage.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func usageErrorf(format string, args ...any) error {
	return &usageError{msg: fmt.Sprintf(format, args...)}
}

// report prints err to w and returns the exit code for it.
func (a *app) report(w io.Writer, cmd *cobra.Command, err error) int {
	var ue *usageError
	if errors.As(err, &ue) || !a.started {
		fmt.Fprintf(w, "lbctl: %v\n", err)
		if cmd != nil {
			fmt.Fprintf(w, "See '%s --help'.\n", cmd.CommandPath())
		}
		return ExitUsage
	}
	st, ok := status.FromError(err)
	if !ok {
		fmt.Fprintf(w, "lbctl: %v\n", err)
		return ExitError
	}
	msg := st.Message()
	switch st.Code() {
	case codes.Unavailable:
		if a.opts.answered {
			msg = fmt.Sprintf("lbd at %s: %s", a.opts.server, msg)
		} else {
			msg = fmt.Sprintf("cannot reach lbd at %s: %s", a.opts.server, msg)
		}
	case codes.DeadlineExceeded:
		msg = fmt.Sprintf("%s (--timeout %v)", msg, a.opts.timeout)
	}
	fmt.Fprintf(w, "lbctl: %s (code: %s)\n", msg, st.Code())
	return ExitError
}

// run wraps a command's code: it marks the run as started (see app.started) and gives
// the code a context bounded by --timeout. A watch (-w) is bounded only by a --timeout
// given on the command line: it runs until interrupted otherwise; so does a --wait.
func (a *app) run(fn func(ctx context.Context, cmd *cobra.Command, args []string) error) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, args []string) error {
		a.started = true
		ctx, cancel := context.WithTimeout(cmd.Context(), a.opts.timeout)
		if (a.watching || a.waiting) && !cmd.Flags().Changed("timeout") {
			ctx, cancel = context.WithCancel(cmd.Context())
		}
		defer cancel()
		return fn(ctx, cmd, args)
	}
}

// rootCommand builds the command tree; cobra's own output (help, completion scripts)
// goes to the buffered stdout, its diagnostics to stderr.
func (a *app) rootCommand(stderr io.Writer) *cobra.Command {
	root := &cobra.Command{
		Use:   "lbctl",
		Short: "Control an lbd load balancer",
		Long: `lbctl controls an lbd layer-4 load balancer through its gRPC API: services
(VIP, port, protocol) and their backends, BGP peers, the node itself, and its datapath:
counters, tracked connections and flow traces.`,
		Version:           clientVersion(),
		SilenceErrors:     true,
		SilenceUsage:      true,
		PersistentPreRunE: func(*cobra.Command, []string) error { return a.opts.validate() },
	}
	root.SetVersionTemplate("lbctl {{.Version}}\n")
	root.SetIn(a.stdin)
	root.SetOut(&a.out)
	root.SetErr(stderr)
	a.opts.stderr = stderr
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return &usageError{msg: err.Error()} })
	a.opts.register(root)
	root.AddCommand(
		a.serviceCommand(),
		a.backendCommand(),
		a.nodeCommand(),
		a.bgpCommand(),
		a.statsCommand(),
		a.conntrackCommand(),
		a.socketCommand(),
		a.traceCommand(),
		a.monitorCommand(),
		a.applyCommand(),
		a.diffCommand(),
		a.exportCommand(),
		a.fleetCommand(),
		a.versionCommand(),
	)
	// cobra adds "completion bash|zsh|fish|powershell" itself; make it a group like ours.
	root.InitDefaultCompletionCmd()
	if c, _, err := root.Find([]string{"completion"}); err == nil && c != root {
		c.Args, c.RunE = nil, runGroup
	}
	return root
}

// group returns a command that only holds subcommands.
func group(use, short string, subs ...*cobra.Command) *cobra.Command {
	c := &cobra.Command{
		Use:   use,
		Short: short,
		// cobra's own default for the root command.
		SuggestionsMinimumDistance: 2,
		RunE:                       runGroup,
	}
	c.AddCommand(subs...)
	return c
}

// runGroup runs a command that only holds subcommands. Without one, it prints the
// command's help; with an unknown one, it fails as a usage error (cobra would print the
// help and succeed).
func runGroup(cmd *cobra.Command, args []string) error {
	if len(args) == 0 {
		return cmd.Help()
	}
	msg := fmt.Sprintf("unknown command %q for %q", args[0], cmd.CommandPath())
	if s := cmd.SuggestionsFor(args[0]); len(s) > 0 {
		msg += fmt.Sprintf("; did you mean %q?", s[0])
	}
	return usageErrorf("%s", msg)
}

// exactArgs is cobra.ExactArgs with argument names in the message.
func exactArgs(names ...string) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		switch {
		case len(args) == len(names):
			return nil
		case len(names) == 0:
			return usageErrorf("%q takes no arguments, got %q", cmd.CommandPath(), args)
		default:
			return usageErrorf("%q takes %d argument(s) (%s), got %d", cmd.CommandPath(), len(names), strings.Join(names, ", "), len(args))
		}
	}
}

// connect returns the connection to --server, dialing it on first use.
func (a *app) connect() (*grpc.ClientConn, error) {
	if a.conn == nil {
		conn, err := a.opts.dial()
		if err != nil {
			return nil, err
		}
		a.conn = conn
	}
	return a.conn, nil
}

func (a *app) lb() (lbdv1.LoadBalancerServiceClient, error) {
	conn, err := a.connect()
	if err != nil {
		return nil, err
	}
	return lbdv1.NewLoadBalancerServiceClient(conn), nil
}

func (a *app) bgp() (lbdv1.BgpServiceClient, error) {
	conn, err := a.connect()
	if err != nil {
		return nil, err
	}
	return lbdv1.NewBgpServiceClient(conn), nil
}

func (a *app) node() (lbdv1.NodeServiceClient, error) {
	conn, err := a.connect()
	if err != nil {
		return nil, err
	}
	return lbdv1.NewNodeServiceClient(conn), nil
}

// clientVersion is Version, or else the version Go recorded for the main module.
func clientVersion() string {
	if Version != "" {
		return Version
	}
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" {
		return bi.Main.Version
	}
	return "(devel)"
}
