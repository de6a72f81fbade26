//go:build linux

package testnet

import (
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
)

// PassXDP attaches an XDP program that passes every frame to dev, in native mode, until
// the test ends. A frame sent with XDP_TX out of a veth is dropped unless the veth's
// peer runs an XDP program (docs/testing.md): give the peer of an XDP_TX device this one.
func (ns *NS) PassXDP(tb testing.TB, dev string) {
	tb.Helper()
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Name:    "xdp_pass",
		Type:    ebpf.XDP,
		License: "GPL",
		Instructions: asm.Instructions{
			asm.Mov.Imm(asm.R0, 2), // XDP_PASS
			asm.Return(),
		},
	})
	if err != nil {
		tb.Fatalf("load XDP_PASS program: %v", err)
	}
	tb.Cleanup(func() { prog.Close() })
	idx := ns.Interface(tb, dev).Index
	var l link.Link
	err = ns.DoErr(func() error {
		var err error
		l, err = link.AttachXDP(link.XDPOptions{Program: prog, Interface: idx, Flags: link.XDPDriverMode})
		return err
	})
	if err != nil {
		tb.Fatalf("attach XDP_PASS to %s in %s: %v", dev, ns.Name, err)
	}
	tb.Cleanup(func() { l.Close() })
}
