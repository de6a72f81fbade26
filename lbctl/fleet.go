package lbctl

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc/status"

	"github.com/lbd-dev/lbd/internal/fleetview"
	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
)

func (a *app) fleetCommand() *cobra.Command {
	return group("fleet", "Show whether the LB nodes of a fleet build the same tables",
		a.fleetStatusCommand(),
		a.fleetCheckCommand(),
	)
}

func (a *app) fleetStatusCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "status",
		Short: "List the nodes registered in the fleet store and the services whose digests differ",
		Long: `status asks the node (--server) for its view of the fleet: every node registered in
the etcd store, with its version, readiness and the store revision its datapath holds,
then the services whose digests are not the same on every LB node. It exits with 1 when
a service differs. With the file store there is no fleet: use 'lbctl fleet check'.`,
		Args: exactArgs(),
		RunE: a.run(func(ctx context.Context, _ *cobra.Command, _ []string) error {
			conn, err := a.connect()
			if err != nil {
				return err
			}
			resp, err := lbdv1.NewFleetServiceClient(conn).GetFleet(ctx, &lbdv1.GetFleetRequest{})
			if err != nil {
				return err
			}
			if err := a.print(resp, func(w io.Writer) { a.writeFleet(w, resp) }); err != nil {
				return err
			}
			return divergedError(resp.Diverged)
		}),
	}
}

func (a *app) fleetCheckCommand() *cobra.Command {
	var servers []string
	cmd := &cobra.Command{
		Use:   "check -s NODE1 -s NODE2 ...",
		Short: "Compare the service digests of the nodes given, over their APIs",
		Long: `check asks every node given with -s for its digest of each service (what its
datapath holds and what its desired state says) and lists the services whose digests
are not the same on every node, or that a node lacks. It exits with 1 when a service
differs. It works with any store; the TLS flags apply to every TCP node.`,
		Args: exactArgs(),
		RunE: a.run(func(ctx context.Context, _ *cobra.Command, _ []string) error {
			if len(servers) < 2 {
				return usageErrorf("give at least two nodes to compare: -s NODE1 -s NODE2 ...")
			}
			resp := &lbdv1.GetFleetResponse{}
			var nodes []fleetview.Node
			for _, srv := range servers {
				d, err := a.nodeDigests(ctx, srv)
				if err != nil {
					return err
				}
				resp.Nodes = append(resp.Nodes, &lbdv1.FleetNode{
					Name: srv, Version: d.Node.GetVersion(), Ready: d.Node.GetReady(), ReadyReason: d.Node.GetReadyReason(),
					Digests: d.Digests, ProgramsServices: true,
				})
				nodes = append(nodes, fleetview.Node{Name: srv, Digests: d.Digests})
			}
			resp.Diverged = fleetview.Diverged(nodes)
			if err := a.print(resp, func(w io.Writer) { a.writeFleet(w, resp) }); err != nil {
				return err
			}
			return divergedError(resp.Diverged)
		}),
	}
	// The command's own -s takes the place of the global one: it names several nodes.
	cmd.Flags().StringArrayVarP(&servers, "server", "s", nil, "a node's API address (as the global --server), repeatable; at least two")
	return cmd
}

// nodeDigests asks one node for its digests, over a connection of its own.
func (a *app) nodeDigests(ctx context.Context, server string) (*lbdv1.ListServiceDigestsResponse, error) {
	o := a.opts
	o.server = server
	conn, err := o.dial()
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	resp, err := lbdv1.NewFleetServiceClient(conn).ListServiceDigests(ctx, &lbdv1.ListServiceDigestsRequest{})
	if err != nil {
		st, _ := status.FromError(err)
		return nil, status.Errorf(st.Code(), "node %s: %s", server, st.Message())
	}
	return resp, nil
}

// writeFleet prints the nodes, then the services that differ with each node's digests.
func (a *app) writeFleet(w io.Writer, f *lbdv1.GetFleetResponse) {
	if f.Stale {
		fmt.Fprintf(w, "STALE: %s\n\n", f.StaleReason)
	}
	t := newTable(w)
	row(t, "NODE", "VERSION", "READY", "SERVICES", "REVISION", "UPDATED")
	for _, n := range f.Nodes {
		rev, updated := "-", "-"
		if n.AppliedRevision > 0 {
			rev = fmt.Sprint(n.AppliedRevision)
		}
		if n.UpdateTime != nil {
			updated = a.now().Sub(n.UpdateTime.AsTime()).Round(time.Second).String() + " ago"
		}
		services := "-"
		if n.ProgramsServices {
			services = fmt.Sprint(len(n.Digests))
		}
		row(t, n.Name, dash(n.Version), withReason(yesNo(n.Ready), n.ReadyReason), services, rev, updated)
	}
	t.Flush()
	fmt.Fprintln(w)
	compared := 0
	for _, n := range f.Nodes {
		if n.ProgramsServices {
			compared++
		}
	}
	if len(f.Diverged) == 0 {
		fmt.Fprintf(w, "every service has the same digests on the %d nodes that program services\n", compared)
		return
	}
	fmt.Fprintf(w, "%d service(s) differ between the %d nodes that program services:\n", len(f.Diverged), compared)
	t = newTable(w)
	row(t, "SERVICE", "NODE", "TABLE", "SPEC")
	for _, d := range f.Diverged {
		for _, nd := range d.Digests {
			row(t, d.Name, nd.Node, dash(nd.Digest.GetTable()), dash(nd.Digest.GetSpec()))
		}
	}
	t.Flush()
}

// divergedError makes a fleet command exit with 1 when services differ, after its report.
func divergedError(d []*lbdv1.DivergedService) error {
	if len(d) == 0 {
		return nil
	}
	names := make([]string, 0, len(d))
	for _, s := range d {
		names = append(names, s.Name)
	}
	return &findings{msg: fmt.Sprintf("%d service(s) differ between the nodes: %s", len(d), strings.Join(names, ", "))}
}

// findings is an error of a command that ran and found a problem: its report is printed
// before the error, and it exits with ExitError.
type findings struct{ msg string }

func (f *findings) Error() string { return f.msg }
