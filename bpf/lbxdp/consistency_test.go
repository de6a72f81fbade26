//go:build linux

package lbxdp

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"testing"

	"github.com/lbd-dev/lbd/internal/pktgen"
)

// TestTwoInstancesAgree: two independently loaded datapaths, given the same
// services, backends, tables and seed, choose the same backend for each of
// 100,000 random flows. A third one with another seed must disagree on many:
// otherwise the comparison could not catch anything.
func TestTwoInstancesAgree(t *testing.T) {
	tp := newTopo(t)
	const nBackends = 100
	program := func(d *Datapath, seed uint32) {
		cfg := DefaultConfig()
		cfg.HashSeed, cfg.Source4, cfg.Source6 = seed, src4, src6
		if err := d.SetConfig(cfg); err != nil {
			t.Fatal(err)
		}
		var ids []uint32
		for i := uint32(1); i <= nBackends; i++ {
			b := Backend{Addr: netip.AddrFrom4([4]byte{198, 18, 20, byte(i)}), Port: 8080, Node: netip.AddrFrom4([4]byte{198, 18, 10, byte(i)})}
			if err := d.UpsertBackend(i, b); err != nil {
				t.Fatal(err)
			}
			b6 := Backend{Addr: netip.MustParseAddr(fmt.Sprintf("2001:db8:20::%x", i)), Port: 8080, Node: netip.MustParseAddr(fmt.Sprintf("2001:db8:10::%x", i))}
			if err := d.UpsertBackend(i+nBackends, b6); err != nil {
				t.Fatal(err)
			}
			ids = append(ids, i)
		}
		table := buildTable(t, ids, nil, 65537)
		table6 := make([]uint32, len(table))
		for i, id := range table {
			table6[i] = id + nBackends
		}
		for _, s := range []struct {
			k     ServiceKey
			id    uint32
			table []uint32
		}{
			{ServiceKey{vip4, 80, ProtoTCP}, 1, table},
			{ServiceKey{vip4, 53, ProtoUDP}, 2, table},
			{ServiceKey{vip6, 443, ProtoTCP}, 3, table6},
		} {
			if err := d.UpsertService(s.k, Service{ID: s.id}); err != nil {
				t.Fatal(err)
			}
			if err := d.SetMaglevTable(s.id, s.table); err != nil {
				t.Fatal(err)
			}
		}
	}
	opts := Options{MaxServices: 16, MaxBackends: 256, ConntrackSize: 1024}
	a, b, c := loadDatapath(t, opts), loadDatapath(t, opts), loadDatapath(t, opts)
	program(a, 0xC0FFEE)
	program(b, 0xC0FFEE)
	program(c, 0xBADBEEF)

	rng := rand.New(rand.NewPCG(1, 2))
	frames := make([][]byte, 100000)
	for i := range frames {
		p := pktgen.Packet{SrcPort: uint16(1024 + rng.IntN(64000)), Flags: pktgen.SYN}
		switch rng.IntN(3) {
		case 0:
			p.Src, p.Dst, p.DstPort = netip.AddrFrom4([4]byte{198, 18, byte(128 + rng.IntN(128)), byte(rng.IntN(256))}), vip4, 80
		case 1:
			p.Src, p.Dst, p.DstPort, p.Proto = netip.AddrFrom4([4]byte{198, 19, byte(rng.IntN(256)), byte(rng.IntN(256))}), vip4, 53, ProtoUDP
		default:
			var a16 [16]byte
			copy(a16[:], netip.MustParseAddr("2001:db8:200::").AsSlice())
			for j := 8; j < 16; j++ {
				a16[j] = byte(rng.IntN(256))
			}
			p.Src, p.Dst, p.DstPort = netip.AddrFrom16(a16), vip6, 443
		}
		frames[i] = p.Frame()
	}

	choose := func(d *Datapath, frame []byte) string {
		v, out, err := d.Trace(frame, tp.ifA)
		if err != nil {
			t.Fatal(err)
		}
		if v != XDPTx {
			t.Fatalf("verdict %v", v)
		}
		return backendOf(t, out).String()
	}
	var differ, otherSeed int
	perBackend := map[string]int{}
	tp.ns.Do(t, func() {
		for _, f := range frames {
			x, y, z := choose(a, f), choose(b, f), choose(c, f)
			if x != y {
				differ++
			}
			if x != z {
				otherSeed++
			}
			perBackend[x]++
		}
	})
	if differ != 0 {
		t.Errorf("%d of %d flows got different backends on two identical instances", differ, len(frames))
	}
	if otherSeed < len(frames)/2 {
		t.Errorf("another seed changed only %d of %d choices", otherSeed, len(frames))
	}
	if len(perBackend) != 2*nBackends {
		t.Errorf("flows reached %d backends, want all %d", len(perBackend), 2*nBackends)
	}
}
