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

// traceMagic mirrors LB_TRACE_MAGIC: metadata asking for a run without side
// effects.
const traceMagic = 0x6c626474

const traceMetaLen = 8

// Trace runs the program once on frame, as if received on ingressIfindex,
// without side effects: conntrack, affinity and counters are read but never
// written. It returns the verdict and the frame as the program left it (the
// encapsulated packet, a reply, or the input). The FIB lookup resolves in the
// calling thread's network namespace, which must be the interface's.
//
// A flow's answer reflects the current state: an existing conntrack entry
// wins over the Maglev table, as it would for a real packet.
func (d *Datapath) Trace(frame []byte, ingressIfindex int) (Verdict, []byte, error) {
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
		return 0, nil, fmt.Errorf("trace packet: %w", err)
	}
	if len(opts.DataOut) < traceMetaLen {
		return 0, nil, fmt.Errorf("trace packet: short output of %d bytes", len(opts.DataOut))
	}
	return Verdict(ret), opts.DataOut[traceMetaLen:], nil
}
