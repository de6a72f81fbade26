// Command mangen writes the manual pages of lbd (section 8) and lbctl (section 1, one
// page per command) from the flags and commands the binaries define, with cobra's man
// page generator:
//
//	go run ./docs/mangen -out DIR [-version VERSION]
//
// The release (.goreleaser.yaml) installs them under /usr/share/man.
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/lbd-dev/lbd/daemon/lbd"
	"github.com/lbd-dev/lbd/lbctl"
	"github.com/spf13/cobra"
	"github.com/spf13/cobra/doc"
)

func main() {
	out := flag.String("out", "", "directory to write the pages into (created)")
	version := flag.String("version", "dev", "version printed in the pages' footer")
	flag.Parse()
	if *out == "" || flag.NArg() > 0 {
		fmt.Fprintln(os.Stderr, "usage: mangen -out DIR [-version VERSION]")
		os.Exit(2)
	}
	if err := write(*out, *version); err != nil {
		fmt.Fprintf(os.Stderr, "mangen: %v\n", err)
		os.Exit(1)
	}
}

func write(dir, version string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("create %s: %w", dir, err)
	}
	// A fixed date keeps the pages reproducible: SOURCE_DATE_EPOCH when the release
	// sets it, else the Unix epoch.
	date := time.Unix(0, 0).UTC()
	if s := os.Getenv("SOURCE_DATE_EPOCH"); s != "" {
		var sec int64
		if _, err := fmt.Sscan(s, &sec); err != nil {
			return fmt.Errorf("SOURCE_DATE_EPOCH %q: %w", s, err)
		}
		date = time.Unix(sec, 0).UTC()
	}
	source := "lbd " + version
	daemon := daemonCommand()
	daemon.DisableAutoGenTag = true
	f, err := os.Create(filepath.Join(dir, "lbd.8"))
	if err != nil {
		return err
	}
	defer f.Close()
	if err := doc.GenMan(daemon, &doc.GenManHeader{Title: "LBD", Section: "8", Date: &date, Source: source, Manual: "System Manager's Manual"}, f); err != nil {
		return fmt.Errorf("lbd.8: %w", err)
	}
	if err := f.Close(); err != nil {
		return err
	}
	cli := lbctl.Command()
	cli.DisableAutoGenTag = true
	if err := doc.GenManTree(cli, &doc.GenManHeader{Title: "LBCTL", Section: "1", Date: &date, Source: source, Manual: "User Commands"}, dir); err != nil {
		return fmt.Errorf("lbctl pages: %w", err)
	}
	return nil
}

// daemonCommand describes lbd for cobra's generator: lbd's own flags, as lbd.Main
// parses it, under the command's name and description.
func daemonCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "lbd [flags]",
		Short: "layer-4 load balancer daemon: XDP and Maglev on LB nodes, Geneve DSR to backend nodes",
		Long: `lbd is a layer-4 load balancer. On an LB node (--role lb) an XDP program balances
each flow to a backend with a Maglev table and sends it, Geneve-encapsulated, to the
backend's node; on a backend node (--role backend) TC programs decapsulate it and
rewrite the replies so that they go straight to the client from the VIP. VIPs are
advertised over BGP. lbd is programmed through its gRPC API, with lbctl(1) or the
Kubernetes adapter.

The configuration file (--config, /etc/lbd/lbd.yaml in the units) holds every setting;
the flags below override it. The desired state (services, backends, BGP peers) is kept
in state_dir/state.pb. SIGTERM stops lbd and leaves its programs forwarding; --detach
removes them.

Files: /etc/lbd/lbd.yaml, /var/lib/lbd/state.pb, /run/lbd/lbd.sock (the API),
/sys/fs/bpf/lbd (pinned programs and maps); units lbd-lb.service and lbd-backend.service.`,
		Run: func(*cobra.Command, []string) {},
	}
	cmd.Flags().AddFlagSet(lbd.Command().Flags())
	return cmd
}
