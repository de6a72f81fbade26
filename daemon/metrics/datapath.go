package metrics

import (
	"net"
	"strconv"

	"github.com/lbd-dev/lbd/daemon/servicematch"
	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
)

// StatsFunc reads the datapath's counters: every service's, and the backends' of the
// services backendsOf selects (none if it is nil).
type StatsFunc func(backendsOf func(service string) bool) (*lbdv1.GetStatsResponse, error)

// BackendSeries says which services' backends get series of their own (lbd_backend_*):
// none (the zero value), every service's (All), or those of the services that Services
// selects.
type BackendSeries struct {
	All      bool
	Services servicematch.Set
}

// For reports whether the backends of the named service get series.
func (b BackendSeries) For(service string) bool { return b.All || b.Services.Match(service) }

func (b BackendSeries) none() bool { return !b.All && b.Services.Empty() }

// Datapath families, written at scrape time from one read of the counters.
const (
	allPackets = "lbd_services_packets_total"
	allBytes   = "lbd_services_bytes_total"
	allFlows   = "lbd_services_new_flows_total"
	svcPackets = "lbd_service_packets_total"
	svcBytes   = "lbd_service_bytes_total"
	svcFlows   = "lbd_service_new_flows_total"
	bePackets  = "lbd_backend_packets_total"
	beBytes    = "lbd_backend_bytes_total"
	beFlows    = "lbd_backend_new_flows_total"
	events     = "lbd_datapath_packets_total"
	sockEvents = "lbd_socket_lb_calls_total"
	ctEvents   = "lbd_conntrack_events_total"
	quicRoutes = "lbd_quic_packets_total"
	onlyWith   = " (only with metrics.backend_series or metrics.backend_series_services)"
	perService = " (for every service up to metrics.service_series_limit services; above it, for those metrics.service_series_services selects)"
)

// writeDatapath writes the families of one read of the counters: the node totals, the
// counters of the services keep selects (pick), and the backends' if withBackends
// (they were asked for). total is nil on a node without the LB role.
func writeDatapath(t *textWriter, st *lbdv1.GetStatsResponse, keep map[string]bool, total *counts, withBackends bool) {
	if total != nil {
		for _, f := range []struct {
			name, help string
			value      uint64
		}{
			{allPackets, "Packets an LB node forwarded for its services, all together, while lbd ran (a new service's from the first scrape that saw it).", total.packets},
			{allBytes, "Bytes (client IP packets) an LB node forwarded for its services, all together, while lbd ran.", total.bytes},
			{allFlows, "New flows an LB node balanced for its services, all together, while lbd ran.", total.flows},
		} {
			t.family(f.name, "counter", f.help)
			t.counter(f.name, f.value)
		}
	}
	svc := []struct {
		name, help string
		value      func(*lbdv1.ServiceStats) uint64
	}{
		{svcPackets, "Packets forwarded for a service" + perService + ".", (*lbdv1.ServiceStats).GetPackets},
		{svcBytes, "Bytes (client IP packets) forwarded for a service" + perService + ".", (*lbdv1.ServiceStats).GetBytes},
		{svcFlows, "New flows balanced for a service" + perService + ".", (*lbdv1.ServiceStats).GetNewFlows},
	}
	for _, f := range svc {
		started := false
		for _, s := range st.Services {
			if !exported(keep, s.ServiceName) {
				continue
			}
			if !started {
				t.family(f.name, "counter", f.help)
				started = true
			}
			t.counter(f.name, f.value(s), "service", s.ServiceName)
		}
	}
	if withBackends {
		be := []struct {
			name, help string
			value      func(*lbdv1.BackendStats) uint64
		}{
			{bePackets, "Packets forwarded to a backend" + onlyWith + ".", (*lbdv1.BackendStats).GetPackets},
			{beBytes, "Bytes forwarded to a backend" + onlyWith + ".", (*lbdv1.BackendStats).GetBytes},
			{beFlows, "New flows balanced to a backend" + onlyWith + ".", (*lbdv1.BackendStats).GetNewFlows},
		}
		var labels []string // every backend's, in the order written
		for _, s := range st.Services {
			for _, b := range s.Backends {
				labels = append(labels, backendLabel(b.Address, b.Port))
			}
		}
		for _, f := range be {
			t.family(f.name, "counter", f.help)
			i := 0
			for _, s := range st.Services {
				for _, b := range s.Backends {
					t.counter(f.name, f.value(b), "backend", labels[i], "service", s.ServiceName)
					i++
				}
			}
		}
	}
	if len(st.Reasons) > 0 {
		t.family(events, "counter", "Datapath packets by event or drop reason.")
		for _, r := range st.Reasons {
			t.counter(events, r.Packets, "reason", r.Name)
		}
	}
	for _, f := range []struct {
		name, help, label string
		events            []*lbdv1.EventCounter
	}{
		{sockEvents, "Socket calls of local processes handled by socket-level load balancing, by event (connect, sendmsg, reverse, no_backend, revnat_full).", "event", st.SocketEvents},
		{ctEvents, "What the LB node's conntrack did, by event: inserted, tentative, confirmed, guard_skipped, guard_engaged, insert_failed, reclaimed.", "event", st.ConntrackEvents},
		{quicRoutes, "Packets of QUIC-aware UDP services by route: routed_cid (by the server ID in the destination connection ID), fallback_client_cid (Initial or 0-RTT), fallback_unknown_id (another config rotation, or a server ID no backend of the service has), fallback_malformed.", "route", st.QuicRoutes},
	} {
		if len(f.events) == 0 {
			continue
		}
		t.family(f.name, "counter", f.help)
		for _, e := range f.events {
			t.counter(f.name, e.Count, f.label, e.Name)
		}
	}
}

// backendLabel is a backend's label value: address:port, [address]:port for IPv6.
func backendLabel(addr string, port uint32) string {
	return net.JoinHostPort(addr, strconv.FormatUint(uint64(port), 10))
}
