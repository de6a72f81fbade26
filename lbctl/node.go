package lbctl

import (
	"context"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"

	"github.com/spf13/cobra"

	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
)

func (a *app) nodeCommand() *cobra.Command {
	return group("node", "Show, drain, verify and detach this lbd node",
		a.nodeGetCommand(),
		a.nodeDrainCommand(true),
		a.nodeDrainCommand(false),
		a.nodeVerifyCommand(),
		a.nodeDetachCommand(),
	)
}

func (a *app) nodeVerifyCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "verify",
		Short: "Read the datapath back now, repair what differs from the desired state, and say what",
		Long: `Read the node's BPF maps and program attachments back, compare them with the desired
state, repair every difference and list what was repaired. lbd does the same on its own
every datapath.verify_interval; this runs it at once.`,
		Args: exactArgs(),
		RunE: a.run(func(ctx context.Context, _ *cobra.Command, _ []string) error {
			nc, err := a.node()
			if err != nil {
				return err
			}
			resp, err := nc.VerifyNode(ctx, &lbdv1.VerifyNodeRequest{})
			if err != nil {
				return err
			}
			return a.print(resp, func(w io.Writer) {
				if len(resp.Repaired) == 0 {
					fmt.Fprintln(w, "datapath verified: it matches the desired state")
					return
				}
				t := newTable(w)
				row(t, "KIND", "REPAIRED")
				for _, d := range resp.Repaired {
					row(t, d.Kind, d.Description)
				}
				t.Flush()
			})
		}),
	}
}

func (a *app) nodeGetCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "get",
		Short: "Show the node's roles, version and drain state",
		Args:  exactArgs(),
		RunE: a.run(func(ctx context.Context, _ *cobra.Command, _ []string) error {
			nc, err := a.node()
			if err != nil {
				return err
			}
			resp, err := nc.GetNode(ctx, &lbdv1.GetNodeRequest{})
			if err != nil {
				return err
			}
			return a.print(resp.Node, func(w io.Writer) { a.writeNodeDetail(w, resp.Node) })
		}),
	}
}

func (a *app) nodeDrainCommand(drain bool) *cobra.Command {
	use, short, done := "drain", "Withdraw every VIP from BGP; established flows keep being forwarded", "node drained: VIPs withdrawn from BGP"
	if !drain {
		use, short, done = "undrain", "Advertise the node's VIPs again", "node undrained: VIPs advertised again"
	}
	return &cobra.Command{
		Use:   use,
		Short: short,
		Args:  exactArgs(),
		RunE: a.run(func(ctx context.Context, _ *cobra.Command, _ []string) error {
			nc, err := a.node()
			if err != nil {
				return err
			}
			var node *lbdv1.Node
			if drain {
				resp, err := nc.DrainNode(ctx, &lbdv1.DrainNodeRequest{})
				if err != nil {
					return err
				}
				node = resp.Node
			} else {
				resp, err := nc.UndrainNode(ctx, &lbdv1.UndrainNodeRequest{})
				if err != nil {
					return err
				}
				node = resp.Node
			}
			return a.printDone(node, "%s", done)
		}),
	}
}

func (a *app) writeNodeDetail(w io.Writer, n *lbdv1.Node) {
	started := formatTime(n.StartTime)
	if n.StartTime != nil {
		started += fmt.Sprintf(" (up %s)", formatAge(a.now().Sub(n.StartTime.AsTime())))
	}
	datapath := "detached"
	if n.DatapathAttached {
		datapath = "attached"
	}
	ready := "no: " + n.ReadyReason
	if n.Ready {
		ready = "yes"
	}
	t := newTable(w)
	row(t, "Roles:", dash(strings.Join(n.Roles, ", ")))
	row(t, "Version:", dash(n.Version))
	row(t, "Ready:", ready)
	row(t, "Drained:", yesNo(n.Drained))
	row(t, "Datapath:", datapath)
	row(t, "Services:", n.Services)
	row(t, "Backends:", n.Backends)
	row(t, "Started:", started)
	if len(n.DriftRepaired) > 0 {
		var kinds []string
		for _, k := range slices.Sorted(maps.Keys(n.DriftRepaired)) {
			kinds = append(kinds, fmt.Sprintf("%s %d", k, n.DriftRepaired[k]))
		}
		row(t, "Repaired:", strings.Join(kinds, ", "))
	}
	t.Flush()
	if len(n.NextHops) == 0 {
		return
	}
	fmt.Fprintln(w)
	t = newTable(w)
	row(t, "BACKEND NODE", "REACHABLE", "NEXT HOP", "INTERFACE", "SOURCE", "NEIGHBOUR", "REASON")
	for _, h := range n.NextHops {
		neigh := h.Neighbour
		if h.Managed {
			neigh += " (managed)"
		}
		row(t, h.NodeAddress, yesNo(h.Reachable), dash(h.NextHop), dash(h.Interface), dash(h.Source), dash(neigh), h.Reason)
	}
	t.Flush()
}
