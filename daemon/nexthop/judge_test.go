//go:build linux

package nexthop

import (
	"fmt"
	"net/netip"
	"testing"

	"golang.org/x/sys/unix"
)

func TestNudName(t *testing.T) {
	for state, want := range map[int]string{
		0:                   "NONE",
		unix.NUD_INCOMPLETE: "INCOMPLETE",
		unix.NUD_REACHABLE:  "REACHABLE",
		unix.NUD_STALE:      "STALE",
		unix.NUD_DELAY:      "DELAY",
		unix.NUD_PROBE:      "PROBE",
		unix.NUD_FAILED:     "FAILED",
		unix.NUD_NOARP:      "NOARP",
		unix.NUD_PERMANENT:  "PERMANENT",
		0x300:               "0x300",
	} {
		if got := nudName(state); got != want {
			t.Errorf("nudName(%#x) = %q, want %q", state, got, want)
		}
	}
}

func TestNoRoute(t *testing.T) {
	node := netip.MustParseAddr("198.18.0.22")
	for _, c := range []struct {
		err  error
		want string
	}{
		{nil, "no route to backend node 198.18.0.22"},
		{unix.ENETUNREACH, "no route to backend node 198.18.0.22"},
		{fmt.Errorf("wrapped: %w", unix.EHOSTUNREACH), "no route to backend node 198.18.0.22 (unreachable route)"},
		{unix.EINVAL, "no route to backend node 198.18.0.22 (blackhole route)"},
		{unix.EACCES, "no route to backend node 198.18.0.22 (prohibit route)"},
		{unix.ENOBUFS, "no route to backend node 198.18.0.22: route lookup: no buffer space available"},
	} {
		if got := noRoute(node, c.err); got != c.want {
			t.Errorf("noRoute(%v) = %q, want %q", c.err, got, c.want)
		}
	}
}

// TestJudge: reachability and reasons from the interface, the entry and the memory of
// a failure; a failed next hop stays failed through the kernel's INCOMPLETE re-probes
// until its entry holds an address again.
func TestJudge(t *testing.T) {
	node := netip.MustParseAddr("198.18.2.22")
	gw := netip.MustParseAddr("198.18.1.1")
	src := netip.MustParseAddr("198.18.1.11")
	up := uint32(unix.IFF_UP | unix.IFF_RUNNING)
	for _, c := range []struct {
		name         string
		nextHop      netip.Addr
		source       netip.Addr
		flags        uint32
		n            neighbour
		failedBefore bool
		reachable    bool
		failed       bool
		reason       string
	}{
		{"managed via gateway", gw, src, up, neighbour{state: unix.NUD_REACHABLE, ours: true}, false, true, false,
			"via 198.18.1.1 dev eth1 src 198.18.1.11, neighbour REACHABLE (managed)"},
		{"on-link without source", node, netip.Addr{}, up, neighbour{state: unix.NUD_STALE, ours: true}, false, true, false,
			"on-link dev eth1, neighbour STALE (managed)"},
		{"another owner's managed entry", gw, src, up, neighbour{state: unix.NUD_REACHABLE, elsewhere: true}, false, true, false,
			"via 198.18.1.1 dev eth1 src 198.18.1.11, neighbour REACHABLE (managed by another owner)"},
		{"permanent", gw, src, up, neighbour{state: unix.NUD_PERMANENT}, false, true, false,
			"via 198.18.1.1 dev eth1 src 198.18.1.11, neighbour PERMANENT"},
		{"no entry yet", gw, src, up, neighbour{}, false, true, false,
			"via 198.18.1.1 dev eth1 src 198.18.1.11, neighbour NONE"},
		{"still resolving", gw, src, up, neighbour{state: unix.NUD_INCOMPLETE, ours: true}, false, true, false,
			"via 198.18.1.1 dev eth1 src 198.18.1.11, neighbour INCOMPLETE (managed)"},
		{"failed", gw, src, up, neighbour{state: unix.NUD_FAILED, ours: true}, false, false, true,
			"next hop 198.18.1.1 dev eth1 does not answer (neighbour FAILED)"},
		{"re-probed after failing", gw, src, up, neighbour{state: unix.NUD_INCOMPLETE, ours: true}, true, false, true,
			"next hop 198.18.1.1 dev eth1 does not answer (neighbour FAILED, now INCOMPLETE while probed again)"},
		{"flushed after failing", gw, src, up, neighbour{}, true, false, true,
			"next hop 198.18.1.1 dev eth1 does not answer (neighbour FAILED, now NONE while probed again)"},
		{"answers again", gw, src, up, neighbour{state: unix.NUD_REACHABLE, ours: true}, true, true, false,
			"via 198.18.1.1 dev eth1 src 198.18.1.11, neighbour REACHABLE (managed)"},
		{"interface down", gw, src, 0, neighbour{state: unix.NUD_REACHABLE}, false, false, false,
			"interface eth1 toward next hop 198.18.1.1 is down"},
		{"no carrier", gw, src, unix.IFF_UP, neighbour{}, false, false, false,
			"interface eth1 toward next hop 198.18.1.1 has no carrier"},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := Path{Node: node, NextHop: c.nextHop, Interface: "eth1", Ifindex: 2, Source: c.source}
			failed := judge(&p, c.flags, c.n, c.failedBefore)
			if p.Reachable != c.reachable || failed != c.failed || p.Reason != c.reason {
				t.Errorf("reachable %v failed %v reason %q\nwant      %v        %v        %q", p.Reachable, failed, p.Reason, c.reachable, c.failed, c.reason)
			}
			if p.Managed != c.n.ours || p.Neighbour != nudName(c.n.state) {
				t.Errorf("Managed %v Neighbour %s, want %v %s", p.Managed, p.Neighbour, c.n.ours, nudName(c.n.state))
			}
		})
	}
}
