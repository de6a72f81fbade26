//go:build linux

package lbxdp

import (
	"net/netip"
	"testing"

	"github.com/lbd-dev/lbd/internal/pktgen"
)

// TestVIPTrafficNeverPassedUp: VIP traffic lbd does not balance is dropped and
// counted, never handed to the kernel (which would route it back to the router): an
// IPv6 packet with more extension headers than lbd follows. The same packet to
// another address passes. An ICMP error about a VIP flow honours the service's source
// ranges like the flow's own packets.
func TestVIPTrafficNeverPassedUp(t *testing.T) {
	e := encapEnv(t)
	p := pktgen.Packet{Src: client6, Dst: vip6, SrcPort: 1234, DstPort: 80, DestOpts: 5}
	five := p.Frame()
	p.Dst = netip.MustParseAddr("2001:db8:f00::99")
	fiveOther := p.Frame()
	p.Dst, p.DestOpts = vip6, 2
	two := p.Frame()

	if err := e.d.UpsertService(ServiceKey{vip4, 80, ProtoTCP}, Service{ID: 1, SourceRanges: true}); err != nil {
		t.Fatal(err)
	}
	if err := e.d.AddSourceRange(1, netip.MustParsePrefix("198.18.200.0/29")); err != nil {
		t.Fatal(err)
	}
	e.runCases(t, []pktgen.Case[caseEnv, Verdict]{
		{Name: "five extension headers to a vip", In: five, Verdict: XDPDrop, Check: counted(DropExtHeaders)},
		{Name: "five extension headers elsewhere", In: fiveOther, Verdict: XDPPass, Check: unchanged},
		{Name: "two extension headers to a vip", In: two, Verdict: XDPTx},
		{Name: "icmp error about an allowed client", In: icmpError(vip4, client4, 80, 40000, 3, 4, 1280, 28), Verdict: XDPTx},
		{Name: "icmp error about a client outside the source ranges",
			In:      icmpError(vip4, netip.MustParseAddr("198.18.201.1"), 80, 40000, 3, 4, 1280, 28),
			Verdict: XDPDrop, Check: counted(DropSourceRange)},
	})
}
