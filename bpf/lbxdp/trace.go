//go:build linux

package lbxdp

import (
	"encoding/binary"
	"fmt"

	"github.com/cilium/ebpf"
)

// Verdict is an XDP action.
type Verdict uint32

// XDP actions.
const (
	XDPAborted  Verdict = 0
	XDPDrop     Verdict = 1
	XDPPass     Verdict = 2
	XDPTx       Verdict = 3
	XDPRedirect Verdict = 4
)

func (v Verdict) String() string {
	switch v {
	case XDPAborted:
		return "XDP_ABORTED"
	case XDPDrop:
		return "XDP_DROP"
	case XDPPass:
		return "XDP_PASS"
	case XDPTx:
		return "XDP_TX"
	case XDPRedirect:
		return "XDP_REDIRECT"
	}
	return fmt.Sprintf("xdp(%d)", uint32(v))
}

// XDPMD is the xdp_md context of a test run: offsets into the input, and the
// ingress interface whose namespace the FIB lookup uses.
type XDPMD struct {
	Data           uint32
	DataEnd        uint32
	DataMeta       uint32
	IngressIfindex uint32
	RxQueueIndex   uint32
	EgressIfindex  uint32
}

// traceMagic is LB_TRACE_MAGIC, as bpf2go generates it: metadata asking for a run
// without side effects.
const traceMagic = uint32(lbxdpLbTraceMagicLB_TRACE_MAGIC)

// traceMetaLen is sizeof(struct lb_trace_meta) (checked against lbxdpLbTraceMeta by
// TestConstantsAsCompiled).
const traceMetaLen = 8

// reasonNone is LB_REASON_NONE (enum lb_drop_reason), as bpf2go generates it.
const reasonNone = uint8(lbxdpLbDropReasonLB_REASON_NONE)

// TraceResult is what one traced packet went through.
type TraceResult struct {
	Verdict Verdict
	// Frame is the packet as the program left it: encapsulated, a reply, or the input.
	Frame []byte
	// Reason is set when the packet hit a counted reason (a drop, an answer, a pass
	// for neighbour resolution); HasReason says whether it did.
	Reason    DropReason
	HasReason bool
	// FIBResult is the last bpf_fib_lookup result (BPF_FIB_LKUP_RET_*), when
	// FIBLookedUp; a cached route needs no lookup.
	FIBResult   FIBResult
	FIBLookedUp bool
	// QUIC is how a QUIC service's packet was routed (QUICNone for others).
	QUIC QUICRoute
}

// FIBResult is a bpf_fib_lookup return code.
type FIBResult uint8

var fibResults = [...]string{"success", "blackhole route", "unreachable route", "prohibit route",
	"not forwarded (no route)", "forwarding disabled on the ingress interface", "unsupported lightweight tunnel",
	"next hop not resolved (no neighbour entry)", "fragmentation needed", "no source address"}

func (r FIBResult) String() string {
	if int(r) < len(fibResults) {
		return fibResults[r]
	}
	return fmt.Sprintf("fib result %d", uint8(r))
}

// Trace runs the program once on frame, as if received on ingressIfindex,
// without side effects: conntrack, affinity and counters are read but never
// written. The FIB lookup resolves in the calling thread's network namespace,
// which must be the interface's.
//
// A flow's answer reflects the current state: an existing conntrack entry
// wins over the Maglev table, as it would for a real packet.
func (d *Datapath) Trace(frame []byte, ingressIfindex int) (Verdict, []byte, error) {
	r, err := d.TraceResult(frame, ingressIfindex)
	return r.Verdict, r.Frame, err
}

// TraceResult is Trace with the reasons the program reported for its verdict.
func (d *Datapath) TraceResult(frame []byte, ingressIfindex int) (TraceResult, error) {
	in := make([]byte, traceMetaLen+len(frame))
	binary.NativeEndian.PutUint32(in, traceMagic)
	copy(in[traceMetaLen:], frame)
	out := make([]byte, len(in)+512)
	opts := ebpf.RunOptions{
		Data:    in,
		DataOut: out,
		Context: XDPMD{Data: traceMetaLen, DataEnd: uint32(len(in)), IngressIfindex: uint32(ingressIfindex)},
	}
	ret, err := d.objs.LbXdp.Run(&opts)
	if err != nil {
		return TraceResult{}, fmt.Errorf("trace packet: %w", err)
	}
	if len(opts.DataOut) < traceMetaLen {
		return TraceResult{}, fmt.Errorf("trace packet: short output of %d bytes", len(opts.DataOut))
	}
	meta := opts.DataOut[:traceMetaLen]
	r := TraceResult{Verdict: Verdict(ret), Frame: opts.DataOut[traceMetaLen:]}
	if meta[4] != reasonNone {
		r.Reason, r.HasReason = DropReason(meta[4]), true
	}
	r.FIBResult, r.FIBLookedUp, r.QUIC = FIBResult(meta[5]), meta[6] != 0, QUICRoute(meta[7])
	return r, nil
}
