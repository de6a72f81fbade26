//go:build linux

package datapath

import (
	"errors"
	"net"
	"net/netip"
	"time"

	"github.com/lbd-dev/lbd/bpf/lbxdp"
	"github.com/lbd-dev/lbd/daemon/monitor"
	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// Defaults of the monitor's limits (Config.MonitorSample, Config.MonitorRate).
const (
	DefaultMonitorSample = 1
	DefaultMonitorRate   = 1000
)

// ErrNoMonitor is returned by OpenMonitor on a node without the LB role.
var ErrNoMonitor = errors.New("the packet monitor needs the LB role")

// MonitorReasons names the reasons the XDP program reports, as metrics and traces name them.
func MonitorReasons() []string {
	var out []string
	for _, r := range lbxdp.DropReasons() {
		out = append(out, r.String())
	}
	return out
}

// SetMonitor implements monitor.Source: it writes what the XDP program reports, with
// the configured sample and rate.
func (m *Manager) SetMonitor(on, forwarded bool) error {
	if !m.cfg.LB || m.lb == nil {
		return ErrNoMonitor
	}
	c := lbxdp.MonitorConfig{Reasons: on, Forwarded: on && forwarded,
		Sample: max(m.cfg.MonitorSample, DefaultMonitorSample), Rate: m.cfg.MonitorRate}
	if c.Rate == 0 {
		c.Rate = DefaultMonitorRate
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.lb.SetMonitor(c)
}

// OpenMonitor implements monitor.Source.
func (m *Manager) OpenMonitor() (monitor.Reader, error) {
	if !m.cfg.LB || m.lb == nil {
		return nil, ErrNoMonitor
	}
	m.mu.Lock()
	r, err := m.lb.MonitorReader()
	m.mu.Unlock()
	if err != nil {
		return nil, err
	}
	return &monitorReader{m: m, r: r, ifnames: map[int]string{}}, nil
}

// MonitorCounters returns the XDP program's monitor counters (zero without the LB role).
func (m *Manager) MonitorCounters() (lbxdp.MonitorCounters, error) {
	if !m.cfg.LB || m.lb == nil {
		return lbxdp.MonitorCounters{}, nil
	}
	return m.lb.MonitorCounters()
}

// monitorReader decodes the XDP program's events into the API's.
type monitorReader struct {
	m       *Manager
	r       *lbxdp.MonitorReader
	ifnames map[int]string
	// services by frontend, read from the manager at most once a second.
	services   map[lbxdp.ServiceKey]string
	servicesAt time.Time
}

// serviceIndexAge is how long the reader names services from its copy of the
// frontends: a service created meanwhile may go unnamed for that long.
const serviceIndexAge = time.Second

func (r *monitorReader) Close() error { return r.r.Close() }

func (r *monitorReader) Read() (*lbdv1.MonitorEvent, error) {
	e, err := r.r.Read()
	if errors.Is(err, lbxdp.ErrMonitorClosed) {
		return nil, monitor.ErrClosed
	}
	if err != nil {
		return nil, err
	}
	ev := &lbdv1.MonitorEvent{
		Time:      timestamppb.New(time.Now().Add(e.Time - lbxdp.MonotonicNow())),
		Reason:    monitor.Forwarded,
		Verdict:   e.Verdict.String(),
		Interface: r.ifname(e.Ifindex),
		Length:    uint32(e.Len),
		Data:      e.Data,
	}
	if e.HasReason {
		ev.Reason = e.Reason.String()
	}
	answered := e.HasReason && (e.Reason == lbxdp.DropRejected || e.Reason == lbxdp.DropTooBig) && e.Verdict == lbxdp.XDPTx
	f := monitor.Decode(e.Data, answered)
	ev.IpProtocol = uint32(f.Proto)
	if f.Client.Addr().IsValid() {
		ev.SourceAddress, ev.SourcePort = f.Client.Addr().String(), uint32(f.Client.Port())
	}
	if f.Destination.Addr().IsValid() {
		ev.DestinationAddress, ev.DestinationPort = f.Destination.Addr().String(), uint32(f.Destination.Port())
		ev.ServiceName = r.service(f.Destination, f.Proto)
	}
	if f.Backend.Addr().IsValid() {
		ev.BackendAddress, ev.BackendPort = f.Backend.Addr().String(), uint32(f.Backend.Port())
	}
	return ev, nil
}

// service names the service of a frontend: the exact port's, else the VIP's all-ports one.
func (r *monitorReader) service(dst netip.AddrPort, proto uint8) string {
	if time.Since(r.servicesAt) > serviceIndexAge {
		r.services = map[lbxdp.ServiceKey]string{}
		r.m.mu.Lock()
		for _, p := range r.m.programmed {
			r.services[p.key] = p.name
		}
		r.m.mu.Unlock()
		r.servicesAt = time.Now()
	}
	if n, ok := r.services[lbxdp.ServiceKey{VIP: dst.Addr(), Port: dst.Port(), Proto: proto}]; ok {
		return n
	}
	return r.services[lbxdp.ServiceKey{VIP: dst.Addr(), Proto: proto}]
}

func (r *monitorReader) ifname(ifindex int) string {
	if n, ok := r.ifnames[ifindex]; ok {
		return n
	}
	n := ""
	if i, err := net.InterfaceByIndex(ifindex); err == nil {
		n = i.Name
	}
	r.ifnames[ifindex] = n
	return n
}
