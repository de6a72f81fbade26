//go:build linux

package lbxdp

import (
	"net/netip"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/lbd-dev/lbd/internal/pktgen"
)

// TestAdoptLegacyConntrack: the flows of the former conntrack map (one LRU for both
// families, 40-byte values) are carried into the per-family maps, expired ones
// left behind, and then followed by the datapath.
func TestAdoptLegacyConntrack(t *testing.T) {
	e := ctEnv(t)
	old, err := ebpf.NewMap(&ebpf.MapSpec{Name: LegacyConntrackName, Type: ebpf.LRUHash, KeySize: 40, ValueSize: 40, MaxEntries: 1024})
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	if !IsLegacyConntrack(old) {
		t.Fatal("legacy layout not recognised")
	}
	now := MonotonicNow()
	put := func(p pktgen.Packet, backend uint32, state CTState, expires time.Duration) {
		var ks ctKeys
		f := flowOf(p)
		src, fam, _ := addrBytes(f.Src.Addr())
		dst, _, _ := addrBytes(f.Dst.Addr())
		ks.v6 = append(ks.v6, lbxdpLbCtKey{Saddr: src, Daddr: dst, Sport: htons(f.Src.Port()), Dport: htons(f.Dst.Port()), Proto: f.Proto, Family: fam})
		v := legacyCT{CreatedNs: uint64(now - time.Minute), LastSeenNs: uint64(now - 3*time.Second), ExpiresNs: uint64(now + expires), BackendID: backend, ServiceID: 1, State: uint8(state)}
		if err := old.Put(&ks.v6[0], &v); err != nil {
			t.Fatal(err)
		}
	}
	live4 := pktgen.Packet{Src: client4, Dst: vip4, SrcPort: 7000, DstPort: 80, Flags: pktgen.ACK}
	live6 := pktgen.Packet{Src: client6, Dst: vip6, SrcPort: 7001, DstPort: 80, Flags: pktgen.ACK}
	dead := pktgen.Packet{Src: client4, Dst: vip4, SrcPort: 7002, DstPort: 80, Flags: pktgen.ACK}
	put(live4, 2, CTEstablished, time.Hour) // the table says backend 1: conntrack must win
	put(live6, 4, CTEstablished, time.Hour)
	put(dead, 2, CTEstablished, -time.Second)

	w, present, err := e.d.AdoptLegacyConntrack(old, MonotonicNow(), true)
	if err != nil || w != 2 || present != 0 {
		t.Fatalf("adopted %d (%d present): %v; want 2", w, present, err)
	}
	ent := e.ct(t, live4)
	if ent.BackendID != 2 || ent.State != CTEstablished || ent.Tentative || ent.LastSeen/time.Second != (now-3*time.Second)/time.Second {
		t.Errorf("adopted entry %+v", ent)
	}
	if _, ok, _ := e.d.ConntrackLookup(flowOf(dead)); ok {
		t.Error("an expired legacy entry was adopted")
	}
	if got := e.sendTo(t, live4); got != beB {
		t.Errorf("adopted IPv4 flow went to %v, want %v", got, beB)
	}
	if got := e.sendTo(t, live6); got != netip.MustParseAddr("2001:db8:20::4") {
		t.Errorf("adopted IPv6 flow went to %v", got)
	}

	// The copy after the switch keeps what the new program wrote since.
	put(live4, 1, CTEstablished, time.Hour)
	w, present, err = e.d.AdoptLegacyConntrack(old, MonotonicNow(), false)
	if err != nil || w != 0 || present != 2 {
		t.Fatalf("second copy wrote %d, %d present: %v; want 0 and 2", w, present, err)
	}
	if ent := e.ct(t, live4); ent.BackendID != 2 {
		t.Errorf("second copy overwrote a newer entry: backend %d", ent.BackendID)
	}
}
