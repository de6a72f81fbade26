//go:build linux

package lbxdp

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/lbd-dev/lbd/internal/pktgen"
	"github.com/lbd-dev/lbd/internal/progrun"
)

// monitorReader opens the ring buffer of e's program for the test.
func monitorReader(t *testing.T, e *env) *MonitorReader {
	t.Helper()
	r, err := e.d.MonitorReader()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}

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

func (e *env) setMonitor(t *testing.T, c MonitorConfig) {
	t.Helper()
	if err := e.d.SetMonitor(c); err != nil {
		t.Fatal(err)
	}
}

func (e *env) monitorCounters(t *testing.T) MonitorCounters {
	t.Helper()
	c, err := e.d.MonitorCounters()
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestMonitor: with the monitor on, a packet that hits a reason reaches the ring
// buffer with that reason, its verdict, its interface and its bytes; forwarded
// packets only when asked for; nothing at all while the monitor is off.
func TestMonitor(t *testing.T) {
	e := encapEnv(t)
	r := monitorReader(t, e)
	bad := pktgen.Edit(pktgen.Packet{Src: client4, Dst: vip4, SrcPort: 7, DstPort: 80, Payload: pktgen.Bytes(200)}.Frame(),
		func(b []byte, at pktgen.Offsets) { b[at.L3] = 0x44 })
	noService := pktgen.Packet{Src: client4, Dst: vip4, SrcPort: 7, DstPort: 9999}.Frame()
	forward := pktgen.Packet{Src: client4, Dst: vip4, SrcPort: 8, DstPort: 80}.Frame()

	// Off (the state after Load): the packets are handled, nothing is reported.
	e.expectDrop(t, bad, DropMalformed)
	if v, _ := e.run(t, forward); v != XDPTx {
		t.Fatalf("forwarded packet: verdict %v", v)
	}
	if evs := readEvents(t, r); len(evs) != 0 {
		t.Fatalf("monitor off: %d events, want none", len(evs))
	}
	if c := e.monitorCounters(t); c != (MonitorCounters{}) {
		t.Fatalf("monitor off: counters %+v, want zero", c)
	}

	e.setMonitor(t, MonitorConfig{Reasons: true, Rate: 1000})
	e.expectDrop(t, bad, DropMalformed)
	e.expectDrop(t, noService, DropNoService)
	if v, _ := e.run(t, forward); v != XDPTx {
		t.Fatalf("forwarded packet: verdict %v", v)
	}
	evs := readEvents(t, r)
	if len(evs) != 2 {
		t.Fatalf("%d events, want the malformed and the no-service drop: %+v", len(evs), evs)
	}
	for i, want := range []struct {
		frame  []byte
		reason DropReason
	}{{bad, DropMalformed}, {noService, DropNoService}} {
		ev := evs[i]
		if !ev.HasReason || ev.Reason != want.reason || ev.Verdict != XDPDrop || ev.Ifindex != e.ifA || ev.Len != len(want.frame) {
			t.Errorf("event %d: reason %v (%v) verdict %v ifindex %d len %d; want %v XDP_DROP %d %d",
				i, ev.Reason, ev.HasReason, ev.Verdict, ev.Ifindex, ev.Len, want.reason, e.ifA, len(want.frame))
		}
		wantData := want.frame[:min(len(want.frame), MonitorSnapLen)]
		if !bytes.Equal(ev.Data, wantData) {
			t.Errorf("event %d: data\n%x\nwant\n%x", i, ev.Data, wantData)
		}
		if age := MonotonicNow() - ev.Time; age < 0 || age > time.Minute {
			t.Errorf("event %d: time %v is %v before now", i, ev.Time, age)
		}
	}

	e.setMonitor(t, MonitorConfig{Forwarded: true, Rate: 1000})
	e.expectDrop(t, bad, DropMalformed)
	_, out := e.run(t, forward)
	evs = readEvents(t, r)
	if len(evs) != 1 || evs[0].HasReason || evs[0].Verdict != XDPTx {
		t.Fatalf("forwarded only: events %+v, want one XDP_TX without reason", evs)
	}
	if n := len(forward) + 62; evs[0].Len != n || !bytes.Equal(evs[0].Data, out[:n]) {
		t.Errorf("forwarded event of %d bytes holds\n%x\nwant the encapsulated frame of %d\n%x", evs[0].Len, evs[0].Data, n, out[:n])
	}
	if got := backendOf(t, out); got.String() != "198.18.20.1" {
		t.Errorf("forwarded to %v", got)
	}

	e.setMonitor(t, MonitorConfig{})
	e.expectDrop(t, bad, DropMalformed)
	if evs := readEvents(t, r); len(evs) != 0 {
		t.Fatalf("monitor off again: %d events", len(evs))
	}
	if c := e.monitorCounters(t); c.Sent != 3 {
		t.Errorf("counters %+v, want 3 sent", c)
	}
}

// TestMonitorLimits: the sampler reports one packet in Sample, and the rate limit
// holds the rest of a burst back; both count what they held back.
func TestMonitorLimits(t *testing.T) {
	e := encapEnv(t)
	r := monitorReader(t, e)
	bad := pktgen.Packet{Src: client4, Dst: vip4, SrcPort: 7, DstPort: 9999}.Frame()
	const n = 100

	// Each burst is one BPF_PROG_TEST_RUN with a repeat count on one pinned CPU, so the
	// per-CPU sampler and bucket see all of it (a drop leaves the frame as it was).
	burst := func() {
		t.Helper()
		e.topo.ns.Do(t, func() {
			err := progrun.OnOneCPU(func() error {
				v, _, _, err := testRunN(e.d.Program(), bad, e.ifA, n)
				if err == nil && v != XDPDrop {
					err = fmt.Errorf("verdict %v, want XDP_DROP", v)
				}
				return err
			})
			if err != nil {
				t.Fatalf("burst: %v", err)
			}
		})
	}

	e.setMonitor(t, MonitorConfig{Reasons: true, Sample: 10, Rate: 1000})
	burst()
	if evs := readEvents(t, r); len(evs) != n/10 {
		t.Errorf("sample 10: %d events of %d packets, want %d", len(evs), n, n/10)
	}
	if c := e.monitorCounters(t); c.Sent != n/10 || c.SampledOut != n-n/10 || c.RateLimited != 0 {
		t.Errorf("sample 10: counters %+v", c)
	}

	// The burst takes far less than the second a second token takes; one may have
	// come meanwhile.
	e.setMonitor(t, MonitorConfig{Reasons: true, Rate: 1})
	before := e.monitorCounters(t)
	burst()
	c := e.monitorCounters(t)
	sent, limited := c.Sent-before.Sent, c.RateLimited-before.RateLimited
	if sent < 1 || sent > 2 || sent+limited != n {
		t.Errorf("rate 1: %d sent and %d held back of %d", sent, limited, n)
	}
	if evs := readEvents(t, r); uint64(len(evs)) != sent {
		t.Errorf("rate 1: %d events read, %d sent", len(evs), sent)
	}
}
