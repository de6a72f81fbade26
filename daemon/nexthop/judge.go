//go:build linux

package nexthop

import (
	"errors"
	"fmt"
	"net/netip"

	"golang.org/x/sys/unix"
)

// neighbour is what resolution found of a next hop's entry.
type neighbour struct {
	state     int  // NUD state; 0 (NONE) when there is no entry
	ours      bool // a managed entry this tracker keeps
	elsewhere bool // a managed entry someone else keeps
}

// nudValid are the states whose entry holds a link-layer address (the kernel's
// NUD_VALID, which x/sys/unix does not define).
const nudValid = unix.NUD_PERMANENT | unix.NUD_NOARP | unix.NUD_REACHABLE | unix.NUD_PROBE | unix.NUD_STALE | unix.NUD_DELAY

// nudNames are the kernel's neighbour states as `ip neigh` prints them.
var nudNames = map[int]string{
	unix.NUD_NONE:       "NONE",
	unix.NUD_INCOMPLETE: "INCOMPLETE",
	unix.NUD_REACHABLE:  "REACHABLE",
	unix.NUD_STALE:      "STALE",
	unix.NUD_DELAY:      "DELAY",
	unix.NUD_PROBE:      "PROBE",
	unix.NUD_FAILED:     "FAILED",
	unix.NUD_NOARP:      "NOARP",
	unix.NUD_PERMANENT:  "PERMANENT",
}

// nudName names a NUD state; an entry is in one state at a time.
func nudName(state int) string {
	if s, ok := nudNames[state]; ok {
		return s
	}
	return fmt.Sprintf("0x%x", state)
}

// routeTypes name the route types RouteGet can return without an error.
var routeTypes = map[int]string{
	unix.RTN_LOCAL:     "local",
	unix.RTN_BROADCAST: "broadcast",
	unix.RTN_ANYCAST:   "anycast",
	unix.RTN_MULTICAST: "multicast",
}

func routeType(t int) string {
	if s, ok := routeTypes[t]; ok {
		return s
	}
	return fmt.Sprintf("%d", t)
}

// noRoute says why the route lookup toward node found nothing usable. The kernel
// answers a lookup that hits no route, or a throw route, with ENETUNREACH, and one that
// hits an unreachable, blackhole or prohibit route with EHOSTUNREACH, EINVAL or EACCES.
func noRoute(node netip.Addr, err error) string {
	s := "no route to backend node " + node.String()
	switch {
	case err == nil || errors.Is(err, unix.ENETUNREACH):
		return s
	case errors.Is(err, unix.EHOSTUNREACH):
		return s + " (unreachable route)"
	case errors.Is(err, unix.EINVAL):
		return s + " (blackhole route)"
	case errors.Is(err, unix.EACCES):
		return s + " (prohibit route)"
	}
	return fmt.Sprintf("%s: route lookup: %v", s, err)
}

// judge fills in p's neighbour fields, Reachable and Reason from the egress
// interface's flags, the next hop's entry, and whether that next hop had failed and
// not answered since. It returns whether the next hop counts as failed now: a FAILED
// entry fails it, and only an entry with a link-layer address again (nudValid) clears
// it, so that the INCOMPLETE of the kernel's next probe does not count as recovery.
func judge(p *Path, linkFlags uint32, n neighbour, failedBefore bool) bool {
	p.Neighbour = nudName(n.state)
	p.Managed = n.ours
	failed := n.state == unix.NUD_FAILED || (failedBefore && n.state&nudValid == 0)
	p.Reachable = false
	switch {
	case linkFlags&unix.IFF_UP == 0:
		p.Reason = fmt.Sprintf("interface %s toward next hop %s is down", p.Interface, p.NextHop)
	case linkFlags&unix.IFF_RUNNING == 0:
		p.Reason = fmt.Sprintf("interface %s toward next hop %s has no carrier", p.Interface, p.NextHop)
	case n.state == unix.NUD_FAILED:
		p.Reason = fmt.Sprintf("next hop %s dev %s does not answer (neighbour FAILED)", p.NextHop, p.Interface)
	case failed:
		p.Reason = fmt.Sprintf("next hop %s dev %s does not answer (neighbour FAILED, now %s while probed again)", p.NextHop, p.Interface, p.Neighbour)
	default:
		p.Reachable = true
		p.Reason = describe(p, n)
	}
	return failed
}

// describe is the reason of a reachable path.
func describe(p *Path, n neighbour) string {
	s := "on-link dev " + p.Interface
	if p.NextHop != p.Node {
		s = fmt.Sprintf("via %s dev %s", p.NextHop, p.Interface)
	}
	if p.Source.IsValid() {
		s += " src " + p.Source.String()
	}
	s += ", neighbour " + p.Neighbour
	switch {
	case n.ours:
		s += " (managed)"
	case n.elsewhere:
		s += " (managed by another owner)"
	}
	return s
}
