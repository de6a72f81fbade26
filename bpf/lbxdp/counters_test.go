//go:build linux

package lbxdp

import (
	"bytes"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/lbd-dev/lbd/internal/pktgen"
)

// TestCounters: per-service and per-backend packets, bytes and new flows, and
// per-reason drops, summed over CPUs.
func TestCounters(t *testing.T) {
	e := ctEnv(t)
	syn := pktgen.Packet{Src: client4, Dst: vip4, SrcPort: 100, DstPort: 80}
	ack := pktgen.Packet{Src: client4, Dst: vip4, SrcPort: 100, DstPort: 80, Flags: pktgen.ACK, Payload: pktgen.Bytes(60)}
	other := pktgen.Packet{Src: client4, Dst: vip4, SrcPort: 101, DstPort: 80}
	e.sendTo(t, syn)
	e.sendTo(t, ack)
	e.sendTo(t, ack)
	e.sendTo(t, other)
	want := Counters{Packets: 4, Bytes: 40 + 100 + 100 + 40, NewFlows: 2}
	svc, err := e.d.ServiceCounters(1)
	if err != nil {
		t.Fatal(err)
	}
	be, err := e.d.BackendCounters(1)
	if err != nil {
		t.Fatal(err)
	}
	if svc != want || be != want {
		t.Errorf("service %+v backend %+v, want %+v", svc, be, want)
	}
	if c, _ := e.d.BackendCounters(2); c != (Counters{}) {
		t.Errorf("unused backend counted %+v", c)
	}
	e.expectDrop(t, pktgen.Packet{Src: client4, Dst: vip4, SrcPort: 1, DstPort: 80, Payload: pktgen.Bytes(2)}.Frame()[:30], DropMalformed)
	if err := e.d.ResetServiceCounters(1); err != nil {
		t.Fatal(err)
	}
	if err := e.d.ResetBackendCounters(1); err != nil {
		t.Fatal(err)
	}
	if c, _ := e.d.ServiceCounters(1); c != (Counters{}) {
		t.Errorf("after reset: %+v", c)
	}
}

// TestTrace: a traced packet gets the verdict and output a real one would,
// without touching conntrack, affinity or counters.
func TestTrace(t *testing.T) {
	e := ctEnv(t)
	frame := pktgen.Packet{Src: client4, Dst: vip4, SrcPort: 555, DstPort: 80}.Frame()
	var v Verdict
	var out []byte
	var err error
	e.ns.Do(t, func() { v, out, err = e.d.Trace(frame, e.ifA) })
	if err != nil {
		t.Fatal(err)
	}
	if v != XDPTx || backendOf(t, out) != beA {
		t.Fatalf("trace: %v to %v", v, backendOf(t, out))
	}
	if _, ok, _ := e.d.ConntrackLookup(flowOf(pktgen.Packet{Src: client4, Dst: vip4, SrcPort: 555, DstPort: 80})); ok {
		t.Error("trace created a conntrack entry")
	}
	if c, _ := e.d.ServiceCounters(1); c != (Counters{}) {
		t.Errorf("trace counted %+v", c)
	}
	// The same frame for real agrees with the trace.
	rv, rout := e.run(t, frame)
	if rv != v || !bytes.Equal(rout, out) {
		t.Error("real run differs from the trace")
	}
	// Trace of a malformed frame does not count a drop either.
	before := e.drops(t)[DropMalformed]
	e.ns.Do(t, func() { v, _, err = e.d.Trace(frame[:20], e.ifA) })
	if err != nil || v != XDPDrop {
		t.Fatalf("trace of a cut frame: %v %v", v, err)
	}
	if e.drops(t)[DropMalformed] != before {
		t.Error("trace counted a drop")
	}
	// A retransmitted SYN follows its flow's entry: so does its trace, after the
	// table changed.
	e.setTable(t, 1, []uint32{2}, 31)
	e.ns.Do(t, func() { v, out, err = e.d.Trace(frame, e.ifA) })
	if err != nil || v != XDPTx || backendOf(t, out) != beA {
		t.Errorf("trace of a retransmitted SYN: %v to %v (%v), want the entry's %v", v, backendOf(t, out), err, beA)
	}
	if got := e.sendTo(t, pktgen.Packet{Src: client4, Dst: vip4, SrcPort: 555, DstPort: 80}); got != beA {
		t.Errorf("retransmitted SYN went to %v, want the entry's %v", got, beA)
	}
}

// TestCountersBatch: the batch readers return, for every ID, what a lookup of that ID
// returns, summed over CPUs, across more than one batch; and they see what the program
// counted.
func TestCountersBatch(t *testing.T) {
	const services, backends = 300, 2*counterBatch + 7
	e := newEnvWith(t, Options{ConntrackSize: 1024, MaxServices: services, MaxBackends: backends})
	ncpu := ebpf.MustPossibleCPU()
	want := make([]Counters, backends)
	for id := uint32(1); id < backends; id += 37 {
		per := make([]lbxdpLbCounter, ncpu)
		for cpu := range per {
			per[cpu] = lbxdpLbCounter{Packets: uint64(id) + uint64(cpu), Bytes: 1000 * uint64(id), NewFlows: uint64(cpu + 1)}
			want[id].Packets += per[cpu].Packets
			want[id].Bytes += per[cpu].Bytes
			want[id].NewFlows += per[cpu].NewFlows
		}
		if err := e.d.objs.LbBeStats.Update(id, per, ebpf.UpdateAny); err != nil {
			t.Fatal(err)
		}
	}
	got, err := e.d.AllBackendCounters(backends)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != backends {
		t.Fatalf("%d backend counters, want %d", len(got), backends)
	}
	for id := range uint32(backends) {
		one, err := e.d.BackendCounters(id)
		if err != nil {
			t.Fatal(err)
		}
		if got[id] != want[id] || one != want[id] {
			t.Fatalf("backend %d: batch %+v, lookup %+v, want %+v", id, got[id], one, want[id])
		}
	}
	// Fewer IDs than the map holds: only those are read.
	if part, err := e.d.AllBackendCounters(40); err != nil || len(part) != 40 || part[38] != want[38] {
		t.Fatalf("first 40 backends: %d counters, [38] %+v, %v", len(part), part[38], err)
	}

	e.addBackend(t, backends-1, "198.18.20.1", 8080, "198.18.10.1")
	e.addService(t, svcSetup{ServiceKey{vip4, 80, ProtoTCP}, Service{ID: services - 1}, []uint32{backends - 1}})
	e.sendTo(t, pktgen.Packet{Src: client4, Dst: vip4, SrcPort: 100, DstPort: 80})
	e.sendTo(t, pktgen.Packet{Src: client4, Dst: vip4, SrcPort: 100, DstPort: 80, Flags: pktgen.ACK})
	svc, err := e.d.AllServiceCounters(services)
	if err != nil {
		t.Fatal(err)
	}
	if w := (Counters{Packets: 2, Bytes: 80, NewFlows: 1}); svc[services-1] != w {
		t.Errorf("service %d: %+v, want %+v", services-1, svc[services-1], w)
	}
	be, err := e.d.AllBackendCounters(backends)
	if err != nil {
		t.Fatal(err)
	}
	if w := want[backends-1]; be[backends-1] != (Counters{Packets: w.Packets + 2, Bytes: w.Bytes + 80, NewFlows: w.NewFlows + 1}) {
		t.Errorf("backend %d after traffic: %+v, before %+v", backends-1, be[backends-1], w)
	}
	drops, err := e.d.DropCounters()
	if err != nil || len(drops) != len(DropReasons()) {
		t.Fatalf("drop counters: %v, %v", drops, err)
	}
}
