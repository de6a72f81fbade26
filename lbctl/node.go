package lbctl

import (
	"context"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"

	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
)

func (a *app) nodeCommand() *cobra.Command {
	return group("node", "Show, drain and detach this lbd node",
		a.nodeGetCommand(),
		a.nodeDrainCommand(true),
		a.nodeDrainCommand(false),
		a.nodeDetachCommand(),
	)
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
	t := newTable(w)
	row(t, "Roles:", dash(strings.Join(n.Roles, ", ")))
	row(t, "Version:", dash(n.Version))
	row(t, "Drained:", yesNo(n.Drained))
	row(t, "Datapath:", datapath)
	row(t, "Services:", n.Services)
	row(t, "Backends:", n.Backends)
	row(t, "Started:", started)
	t.Flush()
}
