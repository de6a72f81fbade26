//go:build linux

package backendtc

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"testing"
	"time"

	"github.com/lbd-dev/lbd/bpf/monring"
	"github.com/lbd-dev/lbd/internal/pktgen"
	"github.com/lbd-dev/lbd/internal/progrun"
)

// readEvents reads what the ring buffer holds, waiting at most a moment for it.
func readEvents(t *testing.T, r *MonitorReader) []MonitorEvent {
	t.Helper()
	var out []MonitorEvent
	for {
		r.SetDeadline(time.Now().Add(100 * time.Millisecond))
		ev, err := r.Read()
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, ev)
	}
}

func setMonitor(t *testing.T, d *Datapath, c MonitorConfig) {
	t.Helper()
	if err := d.SetMonitor(c); err != nil {
		t.Fatal(err)
	}
}

func monitorCounters(t *testing.T, d *Datapath) monring.Counters {
	t.Helper()
	c, err := d.MonitorCounters()
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// expectEvent checks that evs is one drop of frame by hook for reason, on the
// interface BPF_PROG_TEST_RUN gives the packet (loopback).
func expectEvent(t *testing.T, evs []MonitorEvent, frame []byte, hook Hook, reason Counter) {
	t.Helper()
	if len(evs) != 1 {
		t.Fatalf("%d events, want 1: %+v", len(evs), evs)
	}
	lo, err := net.InterfaceByName("lo")
	if err != nil {
		t.Fatal(err)
	}
	ev := evs[0]
	if ev.Reason != reason || ev.Hook != hook || ev.Ifindex != lo.Index {
		t.Errorf("event: reason %v, hook %v, ifindex %d; want %v, %v, %d", ev.Reason, ev.Hook, ev.Ifindex, reason, hook, lo.Index)
	}
	want := frame[:min(len(frame), monring.SnapLen)]
	if ev.Len != len(frame) || !bytes.Equal(ev.Data, want) {
		t.Errorf("event carries %d of %d bytes %x; want %d bytes %x", len(ev.Data), ev.Len, ev.Data, len(frame), want)
	}
	if ev.Time <= 0 {
		t.Errorf("event time %v", ev.Time)
	}
}

// TestMonitor: with the monitor on, a packet the ingress or egress program drops
// reaches the ring buffer once, with its drop counter as the reason, its hook, its
// interface and its bytes; passed and decapsulated packets never do; with the monitor
// off (as loaded) nothing is reported.
func TestMonitor(t *testing.T) {
	d := newDatapath(t)
	r, err := d.MonitorReader()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })

	dsr4 := pktgen.DSROption(vipV4)
	// lbd's option in a Geneve control (OAM) packet from an allowed LB: dropped.
	oam := v4Encap(dsr4)
	oam.OAM = true
	badGeneve := oam.Frame(tcpSyn.request())
	good := v4Encap(dsr4).Frame(tcpSyn.request())
	foreign := encapFrom(lbV4, 7, dsr4).Frame(tcpSyn.request())
	// An SCTP flow whose reply egress must drop (TestEgressSCTPPortNotRewritten).
	sctp := sctpInit
	sctp.chunk, sctp.payload = pktgen.SCTPHeartbeat, []byte{0, 1, 0, 8, 1, 2, 3, 4}
	sctpReply := sctp.reply(sctp.backend).Frame()

	dropIn := func() {
		t.Helper()
		if v, _ := run(t, d.IngressProgram(), badGeneve); v != verdictDrop {
			t.Fatalf("ingress verdict %#x, want TCX_DROP", v)
		}
	}

	// Off: the drop is counted, not reported.
	dropIn()
	if evs := readEvents(t, r); len(evs) != 0 {
		t.Fatalf("monitor off: %d events", len(evs))
	}
	if c := monitorCounters(t, d); c != (monring.Counters{}) {
		t.Errorf("monitor off: counters %+v", c)
	}

	setMonitor(t, d, MonitorConfig{Drops: true, Rate: 1000})
	dropIn()
	expectEvent(t, readEvents(t, r), badGeneve, HookIngress, CounterDropBadGeneve)

	// Decapsulated and foreign packets are not drops.
	for name, f := range map[string][]byte{"decapsulated": good, "foreign": foreign} {
		if v, _ := run(t, d.IngressProgram(), f); v != verdictNext {
			t.Fatalf("%s: verdict %#x", name, v)
		}
	}
	if evs := readEvents(t, r); len(evs) != 0 {
		t.Errorf("packets that were not dropped gave %d events: %+v", len(evs), evs)
	}

	if v, _ := run(t, d.IngressProgram(), v4Encap(pktgen.DSROption(vipV4)).Frame(sctp.request())); v != verdictNext {
		t.Fatalf("SCTP ingress verdict %#x", v)
	}
	if v, _ := run(t, d.EgressProgram(), sctpReply); v != verdictDrop {
		t.Fatalf("SCTP egress verdict %#x, want TCX_DROP", v)
	}
	expectEvent(t, readEvents(t, r), sctpReply, HookEgress, CounterDropSNATFailed)
	if c := monitorCounters(t, d); c.Sent != 2 {
		t.Errorf("counters %+v, want 2 sent", c)
	}

	// Off again: nothing more.
	setMonitor(t, d, MonitorConfig{})
	dropIn()
	if evs := readEvents(t, r); len(evs) != 0 {
		t.Errorf("monitor turned off: %d events", len(evs))
	}
}

// TestMonitorLimits: the shared sampler and token bucket (lbd_monitor.h) hold
// backendtc's drops back too, and count what they held back. Each burst is one
// BPF_PROG_TEST_RUN with a repeat count on one pinned CPU, so the per-CPU sampler and
// bucket see all of it (a drop leaves the packet as it was, so every run sees the
// same frame).
func TestMonitorLimits(t *testing.T) {
	d := newDatapath(t)
	r, err := d.MonitorReader()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	oam := v4Encap(pktgen.DSROption(vipV4))
	oam.OAM = true
	bad := oam.Frame(tcpSyn.request())
	const n = 100
	burst := func() {
		t.Helper()
		err := progrun.OnOneCPU(func() error {
			v, _, err := d.IngressProgram().Benchmark(bad, n, nil)
			if err == nil && v != verdictDrop {
				err = fmt.Errorf("verdict %#x, want a drop", v)
			}
			return err
		})
		if err != nil {
			t.Fatalf("burst: %v", err)
		}
	}

	setMonitor(t, d, MonitorConfig{Drops: true, Sample: 10, Rate: 1000})
	burst()
	if evs := readEvents(t, r); len(evs) != n/10 {
		t.Errorf("sample 10: %d events of %d drops, want %d", len(evs), n, n/10)
	}
	if c := monitorCounters(t, d); c.Sent != n/10 || c.SampledOut != n-n/10 || c.RateLimited != 0 {
		t.Errorf("sample 10: counters %+v", c)
	}

	// The burst takes far less than the second a second token takes; one may have
	// come meanwhile.
	setMonitor(t, d, MonitorConfig{Drops: true, Rate: 1})
	before := monitorCounters(t, d)
	burst()
	c := monitorCounters(t, d)
	sent, limited := c.Sent-before.Sent, c.RateLimited-before.RateLimited
	if sent < 1 || sent > 2 || sent+limited != n {
		t.Errorf("rate 1: %d sent and %d held back of %d", sent, limited, n)
	}
	if evs := readEvents(t, r); uint64(len(evs)) != sent {
		t.Errorf("rate 1: %d events read, %d sent", len(evs), sent)
	}
}
