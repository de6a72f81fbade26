//go:build linux

package lbxdp

import (
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/lbd-dev/lbd/internal/pktgen"
)

// TestAffinity: with session affinity, a client's new flows follow its first
// flow's backend (although the 5-tuple hash would spread them) until the
// timeout passes; an expired or dangling entry falls back to the table.
func TestAffinity(t *testing.T) {
	e := newEnv(t)
	var ids []uint32
	for i := uint32(1); i <= 8; i++ {
		e.addBackend(t, i, fmt.Sprintf("198.18.20.%d", i), 8080, fmt.Sprintf("198.18.10.%d", i))
		ids = append(ids, i)
	}
	// Backend 9 exists but is in no table: only affinity can send flows there.
	e.addBackend(t, 9, "198.18.20.9", 8080, "198.18.10.9")
	const timeout = 30 * time.Second
	e.addService(t, svcSetup{ServiceKey{vip4, 80, ProtoTCP}, Service{ID: 1, AffinityTimeout: timeout}, ids})
	e.addService(t, svcSetup{ServiceKey{vip6, 80, ProtoTCP}, Service{ID: 2, AffinityTimeout: timeout}, nil})
	for i := uint32(11); i <= 14; i++ {
		e.addBackend(t, i, fmt.Sprintf("2001:db8:20::%d", i), 8080, fmt.Sprintf("2001:db8:10::%d", i))
	}
	e.setTable(t, 2, []uint32{11, 12, 13, 14}, 31)

	for _, client := range []netip.Addr{client4, client6} {
		vip := vip4
		svc := uint32(1)
		if client.Is6() {
			vip, svc = vip6, 2
		}
		first := e.sendTo(t, pktgen.Packet{Src: client, Dst: vip, SrcPort: 1000, DstPort: 80})
		for i := 1; i < 30; i++ {
			if got := e.sendTo(t, pktgen.Packet{Src: client, Dst: vip, SrcPort: uint16(1000 + i), DstPort: 80}); got != first {
				t.Fatalf("%v: flow %d went to %v, affinity says %v", client, i, got, first)
			}
		}
		entries, err := e.d.Affinity()
		if err != nil {
			t.Fatal(err)
		}
		found := false
		for _, a := range entries {
			if a.ServiceID == svc && a.Client == client {
				found = true
				if now := MonotonicNow(); a.LastSeen > now || now-a.LastSeen > 5*time.Second {
					t.Errorf("affinity last seen %v, now %v", a.LastSeen, now)
				}
			}
		}
		if !found {
			t.Fatalf("no affinity entry for %v", client)
		}
	}

	other := netip.MustParseAddr("198.18.202.1")
	cases := []struct {
		name    string
		age     time.Duration
		backend uint32
		want9   bool
	}{
		{"fresh entry is followed", time.Second, 9, true},
		{"entry at the timeout is followed", timeout - time.Second, 9, true},
		{"expired entry is ignored", timeout + 2*time.Second, 9, false},
		{"entry for a deleted backend is ignored", time.Second, 77, false},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if err := e.d.SetAffinity(AffinityEntry{ServiceID: 1, Client: other, BackendID: c.backend, LastSeen: MonotonicNow() - c.age}); err != nil {
				t.Fatal(err)
			}
			got := e.sendTo(t, pktgen.Packet{Src: other, Dst: vip4, SrcPort: uint16(2000 + i), DstPort: 80})
			if is9 := got == netip.MustParseAddr("198.18.20.9"); is9 != c.want9 {
				t.Errorf("flow went to %v", got)
			}
		})
	}
	if err := e.d.DeleteAffinity(1, other); err != nil {
		t.Fatal(err)
	}
}
