package lbctl

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
)

func (a *app) statsCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "stats",
		Short: "Show the datapath's counters per service, per backend and per reason",
		Long: `Show the datapath's counters: packets, bytes and new flows of each service, with
each of its backends below it, then the drop and event counters by reason, then the
calls socket-level load balancing handled (on nodes where it is on).`,
		Args: exactArgs(),
		RunE: a.run(func(ctx context.Context, _ *cobra.Command, _ []string) error {
			lb, err := a.lb()
			if err != nil {
				return err
			}
			resp, err := lb.GetStats(ctx, &lbdv1.GetStatsRequest{})
			if err != nil {
				return err
			}
			sortStats(resp)
			return a.print(resp, func(w io.Writer) { writeStats(w, resp) })
		}),
	}
}

// sortStats orders services by name, their backends by address and port, and reasons by
// name, so that two runs can be compared line by line.
func sortStats(s *lbdv1.GetStatsResponse) {
	slices.SortFunc(s.Services, func(x, y *lbdv1.ServiceStats) int { return strings.Compare(x.ServiceName, y.ServiceName) })
	for _, svc := range s.Services {
		slices.SortFunc(svc.Backends, func(x, y *lbdv1.BackendStats) int {
			return cmp.Or(compareAddr(x.Address, y.Address), cmp.Compare(x.Port, y.Port))
		})
	}
	slices.SortFunc(s.Reasons, func(x, y *lbdv1.Counter) int { return strings.Compare(x.Name, y.Name) })
	slices.SortFunc(s.SocketEvents, func(x, y *lbdv1.EventCounter) int { return strings.Compare(x.Name, y.Name) })
}

// writeStats writes the services table, each backend indented under its service, then the
// reasons table, then the socket and conntrack events (in the datapath's order: a flow's
// life). A section with nothing in it is left out: a backend-only node has no services,
// an LB with no backend role no backend counters.
func writeStats(w io.Writer, s *lbdv1.GetStatsResponse) {
	if len(s.Services) == 0 && len(s.Reasons) == 0 && len(s.SocketEvents) == 0 && len(s.ConntrackEvents) == 0 {
		fmt.Fprintln(w, "No counters: the datapath has no service and reports no reason.")
		return
	}
	sections := 0
	section := func() *tabwriter.Writer {
		if sections++; sections > 1 {
			fmt.Fprintln(w)
		}
		return newTable(w)
	}
	if len(s.Services) > 0 {
		t := section()
		row(t, "SERVICE/BACKEND", "PACKETS", "BYTES", "NEW FLOWS")
		for _, svc := range s.Services {
			row(t, svc.ServiceName, svc.Packets, svc.Bytes, svc.NewFlows)
			for _, b := range svc.Backends {
				row(t, "  "+formatEndpoint(b.Address, b.Port), b.Packets, b.Bytes, b.NewFlows)
			}
		}
		t.Flush()
	}
	if len(s.Reasons) > 0 {
		t := section()
		row(t, "REASON", "PACKETS")
		for _, r := range s.Reasons {
			row(t, r.Name, r.Packets)
		}
		t.Flush()
	}
	for _, ev := range []struct {
		title, unit string
		events      []*lbdv1.EventCounter
	}{{"SOCKET EVENT", "CALLS", s.SocketEvents}, {"CONNTRACK EVENT", "COUNT", s.ConntrackEvents}} {
		if len(ev.events) == 0 {
			continue
		}
		t := section()
		row(t, ev.title, ev.unit)
		for _, e := range ev.events {
			row(t, e.Name, e.Count)
		}
		t.Flush()
	}
}
