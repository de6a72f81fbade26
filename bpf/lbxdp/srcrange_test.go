//go:build linux

package lbxdp

import (
	"net/netip"
	"testing"

	"github.com/lbd-dev/lbd/internal/pktgen"
)

// TestSourceRanges: a service with source ranges lets in clients from its
// prefixes only (longest match, per service, both families); other services
// are unaffected.
func TestSourceRanges(t *testing.T) {
	e := newEnv(t)
	e.addBackend(t, 1, "198.18.20.1", 8080, "198.18.10.1")
	e.addBackend(t, 2, "2001:db8:20::2", 8080, "2001:db8:10::2")
	e.addService(t, svcSetup{ServiceKey{vip4, 80, ProtoTCP}, Service{ID: 1, SourceRanges: true}, []uint32{1}})
	e.addService(t, svcSetup{ServiceKey{vip4, 81, ProtoTCP}, Service{ID: 2}, []uint32{1}})
	e.addService(t, svcSetup{ServiceKey{vip6, 80, ProtoTCP}, Service{ID: 3, SourceRanges: true}, []uint32{2}})
	e.addService(t, svcSetup{ServiceKey{vip4, 82, ProtoTCP}, Service{ID: 4, SourceRanges: true}, []uint32{1}})
	for _, r := range []struct {
		id uint32
		p  string
	}{{1, "198.18.200.0/24"}, {1, "198.19.7.7/32"}, {3, "2001:db8:200::/48"}, {2, "198.18.250.0/24"}} {
		if err := e.d.AddSourceRange(r.id, netip.MustParsePrefix(r.p)); err != nil {
			t.Fatal(err)
		}
	}
	cases := []struct {
		name  string
		src   string
		vip   netip.Addr
		port  uint16
		allow bool
	}{
		{"inside /24", "198.18.200.7", vip4, 80, true},
		{"exact /32", "198.19.7.7", vip4, 80, true},
		{"next to the /32", "198.19.7.8", vip4, 80, false},
		{"outside", "198.18.201.7", vip4, 80, false},
		{"range of another service", "198.18.250.1", vip4, 80, false},
		{"service without ranges", "198.18.201.7", vip4, 81, true},
		{"service with the flag and no range", "198.18.200.7", vip4, 82, false},
		{"ipv6 inside /48", "2001:db8:200:1::9", vip6, 80, true},
		{"ipv6 outside", "2001:db8:201::9", vip6, 80, false},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			frame := pktgen.Packet{Src: netip.MustParseAddr(c.src), Dst: c.vip, SrcPort: uint16(1000 + i), DstPort: c.port}.Frame()
			if !c.allow {
				e.expectDrop(t, frame, DropSourceRange)
				return
			}
			if v, _ := e.run(t, frame); v != XDPTx {
				t.Fatalf("verdict %v, want XDP_TX", v)
			}
		})
	}
	ranges, err := e.d.SourceRanges()
	if err != nil {
		t.Fatal(err)
	}
	if len(ranges[1]) != 2 || len(ranges[3]) != 1 || ranges[3][0] != netip.MustParsePrefix("2001:db8:200::/48") {
		t.Errorf("listed ranges: %v", ranges)
	}
	if err := e.d.DeleteSourceRange(1, netip.MustParsePrefix("198.18.200.0/24")); err != nil {
		t.Fatal(err)
	}
	e.expectDrop(t, pktgen.Packet{Src: client4, Dst: vip4, SrcPort: 999, DstPort: 80}.Frame(), DropSourceRange)
}
