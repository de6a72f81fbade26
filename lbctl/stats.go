package lbctl

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
)

// statsOptions are the flags of lbctl stats.
type statsOptions struct {
	services   []string
	order      string
	top        uint32
	noBackends bool
	interval   time.Duration
}

func (a *app) statsCommand() *cobra.Command {
	var o statsOptions
	cmd := &cobra.Command{
		Use:   "stats",
		Short: "Show the datapath's counters per service, per backend and per reason",
		Long: `Show the datapath's counters: packets, bytes and new flows of each service, with
each of its backends below it, then the drop and event counters by reason, then the
calls socket-level load balancing handled (on nodes where it is on).

--service selects services by name, or by a pattern where * stands for any run of
characters; --sort orders services, and each service's backends, by a counter, largest
first; --top keeps that many services. With --interval the counters are read twice and
the table shows rates per second over the interval, and for each backend its SHARE of
its service's new flows next to its SLOTS, its share of the service's Maglev table: a
hot backend takes much more than its slots, a dead one nothing (JSON and YAML give the
counts of the interval).`,
		Example: `  lbctl stats --sort packets --top 10 --no-backends   # top talkers
  lbctl stats --service web --sort new-flows --interval 10s   # a hot or dead backend`,
		Args:              exactArgs(),
		ValidArgsFunction: cobra.NoFileCompletions,
		RunE: a.run(func(ctx context.Context, cmd *cobra.Command, _ []string) error {
			if o.interval < 0 || (o.interval > 0 && o.interval < 100*time.Millisecond) {
				return usageErrorf("--interval %v: want at least 100ms", o.interval)
			}
			lb, err := a.lb()
			if err != nil {
				return err
			}
			req := &lbdv1.GetStatsRequest{Services: o.services, OmitBackends: o.noBackends,
				OrderBy: lbdv1.StatsOrder(enumNumber(lbdv1.StatsOrder(0).Descriptor(), o.order))}
			if o.interval == 0 {
				req.Limit = o.top
				resp, err := lb.GetStats(ctx, req)
				if err != nil {
					return err
				}
				sortStats(resp, req.OrderBy)
				if o.top > 0 && int(o.top) < len(resp.Services) {
					resp.Services = resp.Services[:o.top] // the server did; an older one ignores --top
				}
				return a.print(resp, func(w io.Writer) { writeStats(w, resp, nil) })
			}
			// Rates: two reads, ordered and cut to --top on what happened in between.
			first, err := lb.GetStats(ctx, req)
			if err != nil {
				return err
			}
			t0 := time.Now()
			select {
			case <-time.After(o.interval):
			case <-cmd.Context().Done():
				return cmd.Context().Err()
			}
			rctx, cancel := context.WithTimeout(cmd.Context(), a.opts.timeout)
			defer cancel()
			second, err := lb.GetStats(rctx, req)
			if err != nil {
				return err
			}
			r := &rates{delta: statsDelta(first, second), seconds: time.Since(t0).Seconds()}
			sortStats(r.delta, req.OrderBy)
			if o.top > 0 && int(o.top) < len(r.delta.Services) {
				r.delta.Services = r.delta.Services[:o.top]
			}
			if !o.noBackends {
				if r.slots, err = a.tableShares(rctx, lb, r.delta.Services); err != nil {
					return err
				}
			}
			return a.print(r.delta, func(w io.Writer) { writeStats(w, r.delta, r) })
		}),
	}
	f := cmd.Flags()
	f.StringArrayVar(&o.services, "service", nil, "only this service (a name, or a pattern with *); repeatable")
	addEnumChoice(cmd, &o.order, "sort", "order services and backends by this counter, largest first (default name)", lbdv1.StatsOrder(0))
	f.Uint32Var(&o.top, "top", 0, "show only the first N services (after --sort); 0: all")
	f.BoolVar(&o.noBackends, "no-backends", false, "leave the backends out")
	f.DurationVar(&o.interval, "interval", 0, "read twice, this far apart, and show rates per second (e.g. 10s)")
	_ = cmd.RegisterFlagCompletionFunc("service", a.completeFlag(a.completeServices))
	return cmd
}

// rates is what --interval shows: the counts of the interval, its length, and each
// backend's share of its service's Maglev table (service → backend → share).
type rates struct {
	delta   *lbdv1.GetStatsResponse
	seconds float64
	slots   map[string]map[string]float64
}

// statsDelta is what the counters of second add to those of first: services and
// backends present in both, reasons and events by name.
func statsDelta(first, second *lbdv1.GetStatsResponse) *lbdv1.GetStatsResponse {
	type key struct{ svc, be string }
	before := map[key][3]uint64{}
	for _, s := range first.Services {
		before[key{s.ServiceName, ""}] = [3]uint64{s.Packets, s.Bytes, s.NewFlows}
		for _, b := range s.Backends {
			before[key{s.ServiceName, formatEndpoint(b.Address, b.Port)}] = [3]uint64{b.Packets, b.Bytes, b.NewFlows}
		}
	}
	sub := func(now, then uint64) uint64 { return now - min(now, then) } // a counter reset counts from 0
	out := &lbdv1.GetStatsResponse{}
	for _, s := range second.Services {
		p, ok := before[key{s.ServiceName, ""}]
		if !ok {
			continue
		}
		ds := &lbdv1.ServiceStats{ServiceName: s.ServiceName, Packets: sub(s.Packets, p[0]), Bytes: sub(s.Bytes, p[1]), NewFlows: sub(s.NewFlows, p[2])}
		for _, b := range s.Backends {
			if p, ok := before[key{s.ServiceName, formatEndpoint(b.Address, b.Port)}]; ok {
				ds.Backends = append(ds.Backends, &lbdv1.BackendStats{Address: b.Address, Port: b.Port,
					Packets: sub(b.Packets, p[0]), Bytes: sub(b.Bytes, p[1]), NewFlows: sub(b.NewFlows, p[2])})
			}
		}
		out.Services = append(out.Services, ds)
	}
	reasons := map[string][2]uint64{}
	for _, r := range first.Reasons {
		reasons[r.Name] = [2]uint64{r.Packets, r.Bytes}
	}
	for _, r := range second.Reasons {
		p := reasons[r.Name]
		out.Reasons = append(out.Reasons, &lbdv1.Counter{Name: r.Name, Packets: sub(r.Packets, p[0]), Bytes: sub(r.Bytes, p[1])})
	}
	events := func(first, second []*lbdv1.EventCounter) []*lbdv1.EventCounter {
		was := map[string]uint64{}
		for _, e := range first {
			was[e.Name] = e.Count
		}
		var d []*lbdv1.EventCounter
		for _, e := range second {
			d = append(d, &lbdv1.EventCounter{Name: e.Name, Count: sub(e.Count, was[e.Name])})
		}
		return d
	}
	out.SocketEvents = events(first.SocketEvents, second.SocketEvents)
	out.ConntrackEvents = events(first.ConntrackEvents, second.ConntrackEvents)
	return out
}

// tableShares asks for each service's backends and their Maglev table slots, and
// returns each backend's share of its service's table.
func (a *app) tableShares(ctx context.Context, lb lbdv1.LoadBalancerServiceClient, svcs []*lbdv1.ServiceStats) (map[string]map[string]float64, error) {
	out := map[string]map[string]float64{}
	for _, s := range svcs {
		resp, err := lb.GetService(ctx, &lbdv1.GetServiceRequest{Name: s.ServiceName})
		if err != nil {
			return nil, err
		}
		var total uint32
		for _, b := range resp.Service.GetBackends() {
			total += b.TableSlots
		}
		shares := map[string]float64{}
		for _, b := range resp.Service.GetBackends() {
			if total > 0 {
				shares[formatEndpoint(b.Address, b.Port)] = float64(b.TableSlots) / float64(total)
			}
		}
		out[s.ServiceName] = shares
	}
	return out, nil
}

// sortStats orders services and their backends as the server does for order (by name,
// or by a counter, largest first, then by name), and reasons by name, so that two runs
// can be compared line by line.
func sortStats(s *lbdv1.GetStatsResponse, order lbdv1.StatsOrder) {
	counter := func(p, b, f uint64) uint64 {
		switch order {
		case lbdv1.StatsOrder_STATS_ORDER_PACKETS:
			return p
		case lbdv1.StatsOrder_STATS_ORDER_BYTES:
			return b
		case lbdv1.StatsOrder_STATS_ORDER_NEW_FLOWS:
			return f
		}
		return 0
	}
	slices.SortFunc(s.Services, func(x, y *lbdv1.ServiceStats) int {
		return cmp.Or(cmp.Compare(counter(y.Packets, y.Bytes, y.NewFlows), counter(x.Packets, x.Bytes, x.NewFlows)),
			strings.Compare(x.ServiceName, y.ServiceName))
	})
	for _, svc := range s.Services {
		slices.SortFunc(svc.Backends, func(x, y *lbdv1.BackendStats) int {
			return cmp.Or(cmp.Compare(counter(y.Packets, y.Bytes, y.NewFlows), counter(x.Packets, x.Bytes, x.NewFlows)),
				compareAddr(x.Address, y.Address), cmp.Compare(x.Port, y.Port))
		})
	}
	slices.SortFunc(s.Reasons, func(x, y *lbdv1.Counter) int { return strings.Compare(x.Name, y.Name) })
	slices.SortFunc(s.SocketEvents, func(x, y *lbdv1.EventCounter) int { return strings.Compare(x.Name, y.Name) })
}

// writeStats writes the services table, each backend indented under its service, then the
// reasons table, then the socket and conntrack events (in the datapath's order: a flow's
// life). A section with nothing in it is left out: a backend-only node has no services,
// an LB with no backend role no backend counters. With r, the numbers are rates per
// second over r's interval, and each backend has its SHARE of the service's new flows
// and its SLOTS, its share of the service's Maglev table.
func writeStats(w io.Writer, s *lbdv1.GetStatsResponse, r *rates) {
	if len(s.Services) == 0 && len(s.Reasons) == 0 && len(s.SocketEvents) == 0 && len(s.ConntrackEvents) == 0 && len(s.QuicRoutes) == 0 {
		fmt.Fprintln(w, "No counters: the datapath has no service and reports no reason.")
		return
	}
	n := func(v uint64) any {
		if r == nil {
			return v
		}
		return fmt.Sprintf("%.1f", float64(v)/r.seconds)
	}
	unit := ""
	if r != nil {
		unit = "/S"
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
		if r == nil {
			row(t, "SERVICE/BACKEND", "PACKETS", "BYTES", "NEW FLOWS")
		} else {
			row(t, "SERVICE/BACKEND", "PACKETS/S", "BYTES/S", "NEW FLOWS/S", "SHARE", "SLOTS")
		}
		for _, svc := range s.Services {
			row(t, svc.ServiceName, n(svc.Packets), n(svc.Bytes), n(svc.NewFlows))
			for _, b := range svc.Backends {
				cells := []any{"  " + formatEndpoint(b.Address, b.Port), n(b.Packets), n(b.Bytes), n(b.NewFlows)}
				if r != nil {
					share := "-"
					if svc.NewFlows > 0 {
						share = fmt.Sprintf("%.1f%%", 100*float64(b.NewFlows)/float64(svc.NewFlows))
					}
					slots, ok := r.slots[svc.ServiceName][formatEndpoint(b.Address, b.Port)]
					cells = append(cells, share, map[bool]string{true: fmt.Sprintf("%.1f%%", 100*slots), false: "-"}[ok])
				}
				row(t, cells...)
			}
		}
		t.Flush()
	}
	if len(s.Reasons) > 0 {
		t := section()
		row(t, "REASON", "PACKETS"+unit)
		for _, re := range s.Reasons {
			row(t, re.Name, n(re.Packets))
		}
		t.Flush()
	}
	for _, ev := range []struct {
		title, unit string
		events      []*lbdv1.EventCounter
	}{{"SOCKET EVENT", "CALLS", s.SocketEvents}, {"CONNTRACK EVENT", "COUNT", s.ConntrackEvents}, {"QUIC ROUTE", "PACKETS", s.QuicRoutes}} {
		if len(ev.events) == 0 {
			continue
		}
		t := section()
		row(t, ev.title, ev.unit+unit)
		for _, e := range ev.events {
			row(t, e.Name, n(e.Count))
		}
		t.Flush()
	}
}
