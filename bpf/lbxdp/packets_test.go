//go:build linux

package lbxdp

import (
	"net/netip"
	"testing"

	"github.com/lbd-dev/lbd/internal/pktgen"
)

// prog is the program as lbA runs it: lbA is the ingress device, and the calls run in
// the topology's namespace, where the FIB lookups resolve.
func (e *env) prog() pktgen.Prog {
	return pktgen.Prog{
		Program: e.d.Program(),
		Context: func(frame []byte) any {
			return XDPMD{DataEnd: uint32(len(frame)), IngressIfindex: uint32(e.ifA)}
		},
		Within: func(run func()) error { return e.ns.DoErr(func() error { run(); return nil }) },
	}
}

// run feeds one frame to the program as received on lbA.
func (e *env) run(tb testing.TB, frame []byte) (Verdict, []byte) {
	tb.Helper()
	v, out := e.prog().Run(tb, frame)
	return Verdict(v), out
}

// backendOf is where an encapsulated frame goes: its inner destination.
func backendOf(tb testing.TB, out []byte) netip.Addr {
	tb.Helper()
	return pktgen.DecodeGeneve(tb, out).Inner.Dst()
}

// caseEnv is what the hooks of a table case see: the environment the cases share,
// and its drop counters from before the case's frame.
type caseEnv struct {
	*env
	before map[DropReason]Counters
}

// check is the Check of a table case.
type check = func(t *testing.T, e caseEnv, in, out []byte)

// runCases runs table cases against e, one after the other.
func (e *env) runCases(t *testing.T, cases []pktgen.Case[caseEnv, Verdict]) {
	t.Helper()
	pktgen.Run(t, func(t *testing.T) (caseEnv, pktgen.Prog) { return caseEnv{e, e.drops(t)}, e.prog() }, cases)
}

// counted checks that the case's frame counted once under reason, then runs checks.
func counted(reason DropReason, checks ...check) check {
	return func(t *testing.T, e caseEnv, in, out []byte) {
		t.Helper()
		if before, after := e.before[reason].Packets, e.drops(t)[reason].Packets; after != before+1 {
			t.Errorf("drop counter %v: %d -> %d, want +1", reason, before, after)
		}
		for _, c := range checks {
			c(t, e, in, out)
		}
	}
}

// unchanged checks that the program left the frame as it came.
func unchanged(t *testing.T, _ caseEnv, in, out []byte) {
	t.Helper()
	pktgen.ExpectFrame(t, out, in)
}

// ackOf is the packet that follows p in its flow: the same, with only ACK set.
func ackOf(p pktgen.Packet) pktgen.Packet {
	p.Flags = pktgen.ACK
	return p
}
