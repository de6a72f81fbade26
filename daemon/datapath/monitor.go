//go:build linux

package datapath

import (
	"errors"
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/lbd-dev/lbd/bpf/backendtc"
	"github.com/lbd-dev/lbd/bpf/lbxdp"
	"github.com/lbd-dev/lbd/bpf/monring"
	"github.com/lbd-dev/lbd/daemon/monitor"
	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// Defaults of the monitor's limits (Config.MonitorSample, Config.MonitorRate).
const (
	DefaultMonitorSample = 1
	DefaultMonitorRate   = 1000
)

// ErrNoMonitor is returned by SetMonitor and OpenMonitor on a node without the LB or
// backend role.
var ErrNoMonitor = errors.New("the packet monitor needs the LB or backend role")

// hookXDP is how MonitorEvent.hook names lbxdp (backendtc.Hook names the TC programs).
const hookXDP = "xdp"

// verdictTCXDrop is the verdict of a packet a TC program dropped.
const verdictTCXDrop = "TCX_DROP"

// backendReason names a backend-node counter as GetStats and
// lbd_datapath_packets_total{reason} do.
func backendReason(c backendtc.Counter) string { return "backend_" + c.String() }

// MonitorReasons names the reasons the programs of the roles report, as metrics and
// traces name them: the XDP program's on an LB node, the TC programs' drops on a
// backend node.
func MonitorReasons(lb, backend bool) []string {
	var out []string
	if lb {
		for _, r := range lbxdp.DropReasons() {
			out = append(out, r.String())
		}
	}
	if backend {
		for _, c := range backendtc.AllCounters() {
			if c >= backendtc.CounterDropNotAllowed {
				out = append(out, backendReason(c))
			}
		}
	}
	return out
}

// monitored says which of the node's programs the monitor reads: lbxdp may be loaded
// on a node without the LB role (for socket-level load balancing), unattached.
func (m *Manager) monitored() (lb *lbxdp.Datapath, be *backendtc.Datapath) {
	if m.cfg.LB {
		lb = m.lb
	}
	if m.cfg.Backend {
		be = m.be
	}
	return lb, be
}

// monitorLimits are the configured sample and rate, defaults applied.
func (m *Manager) monitorLimits() (sample, rate uint32) {
	sample, rate = max(m.cfg.MonitorSample, DefaultMonitorSample), m.cfg.MonitorRate
	if rate == 0 {
		rate = DefaultMonitorRate
	}
	return sample, rate
}

// SetMonitor implements monitor.Source: it writes what the programs of the node's
// roles report, with the configured sample and rate. Forwarded packets exist only on
// an LB node.
func (m *Manager) SetMonitor(on, forwarded bool) error {
	lb, be := m.monitored()
	if lb == nil && be == nil {
		return ErrNoMonitor
	}
	sample, rate := m.monitorLimits()
	m.mu.Lock()
	defer m.mu.Unlock()
	if lb != nil {
		c := lbxdp.MonitorConfig{Reasons: on, Forwarded: on && forwarded, Sample: sample, Rate: rate}
		if err := lb.SetMonitor(c); err != nil {
			return err
		}
	}
	if be != nil {
		if err := be.SetMonitor(backendtc.MonitorConfig{Drops: on, Sample: sample, Rate: rate}); err != nil {
			return err
		}
	}
	return nil
}

// MonitorCounters returns the monitor counters of the node's programs, summed.
func (m *Manager) MonitorCounters() (monring.Counters, error) {
	lb, be := m.monitored()
	var sum monring.Counters
	if lb != nil {
		c, err := lb.MonitorCounters()
		if err != nil {
			return sum, err
		}
		sum = sum.Add(c)
	}
	if be != nil {
		c, err := be.MonitorCounters()
		if err != nil {
			return sum, err
		}
		sum = sum.Add(c)
	}
	return sum, nil
}

// OpenMonitor implements monitor.Source: one reader over the ring buffers of the
// node's programs (both on a node with both roles).
func (m *Manager) OpenMonitor() (monitor.Reader, error) {
	lb, be := m.monitored()
	if lb == nil && be == nil {
		return nil, ErrNoMonitor
	}
	r := &monitorReader{m: m, ifnames: map[int]string{}, raw: make(chan rawEvent), closed: make(chan struct{})}
	m.mu.Lock()
	defer m.mu.Unlock()
	if lb != nil {
		lr, err := lb.MonitorReader()
		if err != nil {
			return nil, err
		}
		r.start(lr, func() (rawEvent, error) {
			e, err := lr.Read()
			return rawEvent{lb: &e}, err
		})
	}
	if be != nil {
		br, err := be.MonitorReader()
		if err != nil {
			r.Close()
			return nil, err
		}
		r.start(br, func() (rawEvent, error) {
			e, err := br.Read()
			return rawEvent{be: &e}, err
		})
	}
	return r, nil
}

// rawEvent is one program's event, or an error reading one.
type rawEvent struct {
	lb  *lbxdp.MonitorEvent
	be  *backendtc.MonitorEvent
	err error
}

// monitorReader decodes the programs' events into the API's. A goroutine per ring
// buffer hands raw events to Read, which decodes them: the caches below are Read's.
type monitorReader struct {
	m       *Manager
	raw     chan rawEvent
	closed  chan struct{}
	once    sync.Once
	closers []interface{ Close() error }
	wg      sync.WaitGroup

	ifnames map[int]string
	// services by frontend, read from the manager at most once a second.
	services   map[lbxdp.ServiceKey]string
	servicesAt time.Time
}

// start reads one ring buffer until it is closed.
func (r *monitorReader) start(c interface{ Close() error }, read func() (rawEvent, error)) {
	r.closers = append(r.closers, c)
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		for {
			e, err := read()
			if errors.Is(err, monring.ErrClosed) {
				return
			}
			e.err = err
			select {
			case r.raw <- e:
			case <-r.closed:
				return
			}
		}
	}()
}

// serviceIndexAge is how long the reader names services from its copy of the
// frontends: a service created meanwhile may go unnamed for that long.
const serviceIndexAge = time.Second

func (r *monitorReader) Close() error {
	var err error
	r.once.Do(func() {
		close(r.closed)
		for _, c := range r.closers {
			err = errors.Join(err, c.Close())
		}
		r.wg.Wait()
	})
	return err
}

func (r *monitorReader) Read() (*lbdv1.MonitorEvent, error) {
	select {
	case e := <-r.raw:
		switch {
		case e.err != nil:
			return nil, e.err
		case e.lb != nil:
			return r.decodeXDP(*e.lb), nil
		default:
			return r.decodeTC(*e.be), nil
		}
	case <-r.closed:
		return nil, monitor.ErrClosed
	}
}

func (r *monitorReader) decodeXDP(e lbxdp.MonitorEvent) *lbdv1.MonitorEvent {
	ev := &lbdv1.MonitorEvent{
		Time:      eventTime(e.Time),
		Reason:    monitor.Forwarded,
		Verdict:   e.Verdict.String(),
		Interface: r.ifname(e.Ifindex),
		Length:    uint32(e.Len),
		Data:      e.Data,
		Hook:      hookXDP,
	}
	if e.HasReason {
		ev.Reason = e.Reason.String()
	}
	answered := e.HasReason && (e.Reason == lbxdp.DropRejected || e.Reason == lbxdp.DropTooBig) && e.Verdict == lbxdp.XDPTx
	f := monitor.Decode(e.Data, answered)
	ev.IpProtocol = uint32(f.Proto)
	setAddr(&ev.SourceAddress, &ev.SourcePort, f.Client)
	if f.Destination.Addr().IsValid() {
		setAddr(&ev.DestinationAddress, &ev.DestinationPort, f.Destination)
		ev.ServiceName = r.service(f.Destination, f.Proto)
	}
	setAddr(&ev.BackendAddress, &ev.BackendPort, f.Backend)
	return ev
}

// decodeTC reads a backend node's drop: on ingress, Geneve from an LB node (the
// client from the inner packet, the VIP from the DSR option, the backend from the inner
// destination); on egress, a backend's reply, whose destination is the client.
func (r *monitorReader) decodeTC(e backendtc.MonitorEvent) *lbdv1.MonitorEvent {
	ev := &lbdv1.MonitorEvent{
		Time:      eventTime(e.Time),
		Reason:    backendReason(e.Reason),
		Verdict:   verdictTCXDrop,
		Interface: r.ifname(e.Ifindex),
		Length:    uint32(e.Len),
		Data:      e.Data,
		Hook:      e.Hook.String(),
	}
	var f monitor.Flow
	if e.Hook == backendtc.HookEgress {
		f = monitor.Decode(e.Data, true)
		f.Backend, f.Destination = f.Destination, netip.AddrPort{}
	} else {
		f = monitor.Decode(e.Data, false)
	}
	ev.IpProtocol = uint32(f.Proto)
	setAddr(&ev.SourceAddress, &ev.SourcePort, f.Client)
	setAddr(&ev.DestinationAddress, &ev.DestinationPort, f.Destination)
	setAddr(&ev.BackendAddress, &ev.BackendPort, f.Backend)
	return ev
}

// eventTime converts a program's CLOCK_MONOTONIC time to wall-clock time.
func eventTime(t time.Duration) *timestamppb.Timestamp {
	return timestamppb.New(time.Now().Add(t - lbxdp.MonotonicNow()))
}

func setAddr(addr *string, port *uint32, a netip.AddrPort) {
	if a.Addr().IsValid() {
		*addr, *port = a.Addr().String(), uint32(a.Port())
	}
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
