package ipam

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"
)

func mustPool(t *testing.T, name string, auto bool, addrs ...string) *Pool {
	t.Helper()
	p, err := NewPool(name, addrs, auto)
	if err != nil {
		t.Fatalf("NewPool(%v): %v", addrs, err)
	}
	return p
}

func addrs(ss ...string) []netip.Addr {
	var out []netip.Addr
	for _, s := range ss {
		out = append(out, netip.MustParseAddr(s))
	}
	return out
}

func TestNewPool(t *testing.T) {
	for _, tc := range []struct {
		addrs   []string
		wantErr string
	}{
		{addrs: []string{"203.0.113.0/30", "203.0.113.10-203.0.113.12", "2001:db8:ff::/126"}},
		{addrs: []string{"203.0.113.1/30"}, wantErr: "host bits"},
		{addrs: []string{"203.0.113.12-203.0.113.10"}, wantErr: "go up"},
		{addrs: []string{"203.0.113.1-2001:db8::1"}, wantErr: "go up"},
		{addrs: []string{"nonsense"}, wantErr: "neither"},
		{addrs: []string{"203.0.113.0/30", "203.0.113.2-203.0.113.9"}, wantErr: "overlaps"},
		{addrs: nil, wantErr: "no addresses"},
	} {
		_, err := NewPool("p", tc.addrs, true)
		switch {
		case tc.wantErr == "" && err != nil:
			t.Errorf("NewPool(%v): %v", tc.addrs, err)
		case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
			t.Errorf("NewPool(%v) = %v, want an error containing %q", tc.addrs, err, tc.wantErr)
		}
	}
}

func TestPoolContainsAndOverlap(t *testing.T) {
	p := mustPool(t, "a", true, "203.0.113.0/30", "203.0.113.10-203.0.113.12")
	for a, want := range map[string]bool{
		"203.0.113.0": true, "203.0.113.3": true, "203.0.113.4": false, "203.0.113.12": true,
		"203.0.113.13": false, "::ffff:203.0.113.1": true, "2001:db8::1": false,
	} {
		if got := p.Contains(netip.MustParseAddr(a)); got != want {
			t.Errorf("Contains(%s) = %v, want %v", a, got, want)
		}
	}
	q := mustPool(t, "b", true, "203.0.113.12/30")
	if a, ok := p.Overlap(q); !ok || a.String() != "203.0.113.12" {
		t.Errorf("Overlap = %v %v, want 203.0.113.12", a, ok)
	}
	if _, ok := p.Overlap(mustPool(t, "c", true, "203.0.113.16/28")); ok {
		t.Error("disjoint pools overlap")
	}
}

func renderDecisions(ds []Decision) string {
	var parts []string
	for _, d := range ds {
		mark := ""
		if d.Changed {
			mark = "*"
		}
		parts = append(parts, fmt.Sprintf("%s%s=%v", mark, d.Key, d.IPs))
	}
	return strings.Join(parts, " ")
}

func renderEvents(es []Event) string {
	var parts []string
	for _, e := range es {
		parts = append(parts, e.Key+":"+e.Reason)
	}
	return strings.Join(parts, " ")
}

func TestPlan(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	v4, v6, dual := []bool{true}, []bool{false}, []bool{true, false}
	for _, tc := range []struct {
		name       string
		pools      []*Pool
		reqs       []Request
		want       string // * marks a changed decision
		wantEvents string
	}{
		{
			name:       "lowest free address, oldest Service first",
			pools:      []*Pool{mustPool(t, "p", true, "203.0.113.0/30")},
			reqs:       []Request{{Key: "b", Created: t0.Add(time.Second), Families: v4}, {Key: "a", Created: t0, Families: v4}},
			want:       "*a=[203.0.113.0] *b=[203.0.113.1]",
			wantEvents: "a:IPAllocated b:IPAllocated",
		},
		{
			name:  "existing assignments are kept and skipped over",
			pools: []*Pool{mustPool(t, "p", true, "203.0.113.0/30")},
			reqs: []Request{
				{Key: "old", Created: t0, Families: v4},
				{Key: "has", Created: t0.Add(time.Second), Families: v4, Current: addrs("203.0.113.0")},
			},
			want:       "*old=[203.0.113.1] has=[203.0.113.0]",
			wantEvents: "old:IPAllocated",
		},
		{
			name:  "exhausted pool: event, no address",
			pools: []*Pool{mustPool(t, "p", true, "203.0.113.5/32")},
			reqs: []Request{
				{Key: "a", Created: t0, Families: v4, Current: addrs("203.0.113.5")},
				{Key: "b", Created: t0.Add(time.Second), Families: v4},
			},
			want:       "a=[203.0.113.5] b=[]",
			wantEvents: "b:AllocationFailed",
		},
		{
			name:  "a released address is reused",
			pools: []*Pool{mustPool(t, "p", true, "203.0.113.5/32")},
			reqs:  []Request{{Key: "b", Created: t0.Add(time.Second), Families: v4}},
			want:  "*b=[203.0.113.5]", wantEvents: "b:IPAllocated",
		},
		{
			name:  "the same address on two Services: the newer one gets another",
			pools: []*Pool{mustPool(t, "p", true, "203.0.113.0/30")},
			reqs: []Request{
				{Key: "new", Created: t0.Add(time.Second), Families: v4, Current: addrs("203.0.113.0")},
				{Key: "old", Created: t0, Families: v4, Current: addrs("203.0.113.0")},
			},
			want:       "old=[203.0.113.0] *new=[203.0.113.1]",
			wantEvents: "new:IPConflict new:IPAllocated",
		},
		{
			name:  "dual stack takes one address per family, in the Service's family order",
			pools: []*Pool{mustPool(t, "p", true, "203.0.113.0/30", "2001:db8:ff::/127")},
			reqs: []Request{
				{Key: "d", Created: t0, Families: []bool{false, true}},
				{Key: "e", Created: t0.Add(time.Second), Families: dual, Current: addrs("2001:db8:ff::1")},
			},
			want:       "*d=[2001:db8:ff:: 203.0.113.0] *e=[203.0.113.1 2001:db8:ff::1]",
			wantEvents: "d:IPAllocated d:IPAllocated e:IPAllocated",
		},
		{
			name:       "no pool of the family",
			pools:      []*Pool{mustPool(t, "p", true, "203.0.113.0/30")},
			reqs:       []Request{{Key: "a", Created: t0, Families: v6}},
			want:       "a=[]",
			wantEvents: "a:AllocationFailed",
		},
		{
			name:  "requested address: granted when in a pool and free",
			pools: []*Pool{mustPool(t, "p", true, "203.0.113.0/30")},
			reqs: []Request{
				{Key: "a", Created: t0, Families: v4, Wanted: addrs("203.0.113.3")},
				{Key: "b", Created: t0.Add(time.Second), Families: v4, Wanted: addrs("203.0.113.3")},
				{Key: "c", Created: t0.Add(2 * time.Second), Families: v4, Wanted: addrs("198.51.100.1")},
			},
			want:       "*a=[203.0.113.3] b=[] c=[]",
			wantEvents: "a:IPAllocated b:IPConflict c:AllocationFailed",
		},
		{
			name: "named pool; pools without auto-assign serve only by name",
			pools: []*Pool{
				mustPool(t, "auto", true, "203.0.113.0/31"),
				mustPool(t, "manual", false, "203.0.113.100/31"),
			},
			reqs: []Request{
				{Key: "a", Created: t0, Families: v4},
				{Key: "b", Created: t0.Add(time.Second), Families: v4, Pool: "manual"},
				{Key: "c", Created: t0.Add(2 * time.Second), Families: v4, Pool: "missing"},
			},
			want:       "*a=[203.0.113.0] *b=[203.0.113.100] c=[]",
			wantEvents: "a:IPAllocated b:IPAllocated c:AllocationFailed",
		},
		{
			name:  "an address outside every pool is kept, not replaced",
			pools: []*Pool{mustPool(t, "p", true, "203.0.113.0/30")},
			reqs:  []Request{{Key: "a", Created: t0, Families: v4, Current: addrs("198.51.100.9")}},
			want:  "a=[198.51.100.9]",
		},
		{
			name:  "a new requested address: both until lbd has programmed the new one",
			pools: []*Pool{mustPool(t, "p", true, "203.0.113.0/30")},
			reqs:  []Request{{Key: "a", Created: t0, Families: v4, Current: addrs("203.0.113.0"), Wanted: addrs("203.0.113.2")}},
			want:  "*a=[203.0.113.2 203.0.113.0]", wantEvents: "a:IPMoving",
		},
		{
			name:  "moving, the new address not yet programmed: nothing changes",
			pools: []*Pool{mustPool(t, "p", true, "203.0.113.0/30")},
			reqs: []Request{{Key: "a", Created: t0, Families: v4, Current: addrs("203.0.113.2", "203.0.113.0"),
				Wanted: addrs("203.0.113.2"), Programmed: addrs("203.0.113.0")}},
			want: "a=[203.0.113.2 203.0.113.0]",
		},
		{
			name:  "moving, the new address programmed: the old one is released and free for another",
			pools: []*Pool{mustPool(t, "p", true, "203.0.113.0/31")},
			reqs: []Request{
				{Key: "a", Created: t0, Families: v4, Current: addrs("203.0.113.1", "203.0.113.0"),
					Wanted: addrs("203.0.113.1"), Programmed: addrs("203.0.113.0", "203.0.113.1")},
				{Key: "b", Created: t0.Add(time.Second), Families: v4},
			},
			want: "*a=[203.0.113.1] *b=[203.0.113.0]", wantEvents: "a:IPReleased b:IPAllocated",
		},
		{
			name:  "a requested address that another Service holds: the current one stays",
			pools: []*Pool{mustPool(t, "p", true, "203.0.113.0/30")},
			reqs: []Request{
				{Key: "a", Created: t0, Families: v4, Current: addrs("203.0.113.0")},
				{Key: "b", Created: t0.Add(time.Second), Families: v4, Current: addrs("203.0.113.1"), Wanted: addrs("203.0.113.0")},
			},
			want: "a=[203.0.113.0] b=[203.0.113.1]", wantEvents: "b:IPConflict",
		},
		{
			name:  "RequireDualStack with one family exhausted: neither family",
			pools: []*Pool{mustPool(t, "p", true, "203.0.113.0/30", "2001:db8:ff::/128")},
			reqs: []Request{
				{Key: "a", Created: t0, Families: v6, Current: addrs("2001:db8:ff::")},
				{Key: "b", Created: t0.Add(time.Second), Families: dual, RequireDualStack: true},
			},
			want: "a=[2001:db8:ff::] b=[]", wantEvents: "b:AllocationFailed b:DualStackIncomplete",
		},
		{
			name:  "RequireDualStack with both families free: both",
			pools: []*Pool{mustPool(t, "p", true, "203.0.113.0/30", "2001:db8:ff::/128")},
			reqs:  []Request{{Key: "b", Created: t0, Families: dual, RequireDualStack: true}},
			want:  "*b=[203.0.113.0 2001:db8:ff::]", wantEvents: "b:IPAllocated b:IPAllocated",
		},
		{
			name:  "an external IP inside a pool is not allocated to another Service",
			pools: []*Pool{mustPool(t, "p", true, "203.0.113.0/30")},
			reqs: []Request{
				{Key: "ext", Created: t0.Add(time.Second), Families: v4, Reserved: addrs("203.0.113.0")},
				{Key: "a", Created: t0, Families: v4},
			},
			want: "*a=[203.0.113.1] *ext=[203.0.113.2]", wantEvents: "a:IPAllocated ext:IPAllocated",
		},
		{
			name:       "an address of a family the Service no longer has is dropped",
			pools:      []*Pool{mustPool(t, "p", true, "203.0.113.0/30")},
			reqs:       []Request{{Key: "a", Created: t0, Families: v4, Current: addrs("2001:db8:ff::1", "203.0.113.2")}},
			want:       "*a=[203.0.113.2]",
			wantEvents: "",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ds, es := Plan(tc.reqs, tc.pools)
			if got := renderDecisions(ds); got != tc.want {
				t.Errorf("decisions = %s, want %s", got, tc.want)
			}
			if got := renderEvents(es); got != tc.wantEvents {
				t.Errorf("events = %q (%v), want %q", got, es, tc.wantEvents)
			}
		})
	}
}

// TestPlanConditions checks what the allocation's Service condition would say.
func TestPlanConditions(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	pools := []*Pool{mustPool(t, "p", true, "203.0.113.0/32", "2001:db8:ff::/127")}
	ds, _ := Plan([]Request{
		{Key: "ok", Created: t0, Families: []bool{true}},
		{Key: "dual", Created: t0.Add(time.Second), Families: []bool{true, false}, RequireDualStack: true},
		{Key: "moving", Created: t0.Add(2 * time.Second), Families: []bool{false}, Current: addrs("2001:db8:ff::"), Wanted: addrs("2001:db8:ff::1")},
		{Key: "bad", Created: t0.Add(3 * time.Second), Families: []bool{false}, WantedError: "annotation: \"x\" is not an IP address"},
	}, pools)
	var got []string
	for _, d := range ds {
		got = append(got, fmt.Sprintf("%s %v %s: %s", d.Key, d.Allocated, d.Reason, d.Message))
	}
	want := []string{
		"ok true IPAllocated: assigned 203.0.113.0",
		"dual false DualStackIncomplete: ipFamilyPolicy RequireDualStack: no free IPv4 address in pools [p]; no address of either family is assigned until both can be",
		"moving true IPMoving: moving from 2001:db8:ff:: to 2001:db8:ff::1: the old address is released once lbd has programmed the new one",
		"bad false InvalidRequestedIP: annotation: \"x\" is not an IP address",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("decisions:\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}
