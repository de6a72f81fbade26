package ipam

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"
)

// Request is one LoadBalancer Service that is ours, as the allocator sees it.
type Request struct {
	// Key is "<namespace>/<name>".
	Key     string
	Created time.Time
	// Families the Service wants addresses of, in its spec.ipFamilies order (true = IPv4).
	Families []bool
	// RequireDualStack: every family or none (spec.ipFamilyPolicy RequireDualStack).
	RequireDualStack bool
	// Current are the IPs in status.loadBalancer.ingress.
	Current []netip.Addr
	// Wanted are specific addresses asked for (at most one per family); each must lie in
	// a pool. A Service whose current address differs is moved to the wanted one.
	Wanted []netip.Addr
	// WantedError, if set, says why the addresses asked for could not be read.
	WantedError string
	// Programmed are the Service's VIPs that lbd has programmed: a moving Service keeps
	// its old address until the new one is among them.
	Programmed []netip.Addr
	// Reserved are addresses the Service uses as external IPs: never allocated to another.
	Reserved []netip.Addr
	// Pool names the pool to allocate from; empty means any auto-assign pool.
	Pool string
}

// Decision is the ingress IPs a Service should have, and why.
type Decision struct {
	Key string
	IPs []netip.Addr
	// Changed is true when IPs differ from the request's Current: status must be written.
	Changed bool
	// Allocated is true when every family has its address; Reason (CamelCase) and Message
	// say what the allocation is or why it is incomplete, for a Service condition.
	Allocated bool
	Reason    string
	Message   string
}

// Event is something the allocator tells the Service's users, as a Kubernetes Event.
type Event struct {
	Key     string
	Warning bool
	// Reason is a CamelCase word; Message says what happened and what to do.
	Reason  string
	Message string
}

// Reasons of the allocation's Events and conditions.
const (
	ReasonAllocated          = "IPAllocated"
	ReasonReleased           = "IPReleased"
	ReasonMoving             = "IPMoving"
	ReasonConflict           = "IPConflict"
	ReasonFailed             = "AllocationFailed"
	ReasonDualStack          = "DualStackIncomplete"
	ReasonInvalidRequestedIP = "InvalidRequestedIP"
)

// planner is one run of Plan.
type planner struct {
	pools []*Pool
	// used maps each address in use to the Service holding it.
	used   map[netip.Addr]string
	events []Event
}

// Plan decides the ingress IPs of every request. Addresses a Service already has are kept
// (older Services first, so a conflict moves the newer one); only then are missing
// families allocated, lowest free address first, so a restarted or newly elected
// allocator never reshuffles working VIPs. Addresses of deleted Services are free because
// nothing holds them. A Service that asks for another address than it has gets both
// until lbd has programmed the new one, then only the new one: clients of the old address
// are not cut before the new one works.
func Plan(reqs []Request, pools []*Pool) ([]Decision, []Event) {
	sorted := slices.Clone(reqs)
	slices.SortFunc(sorted, func(a, b Request) int {
		return cmp.Or(a.Created.Compare(b.Created), strings.Compare(a.Key, b.Key))
	})
	p := &planner{pools: pools, used: map[netip.Addr]string{}}
	kept := make([][]netip.Addr, len(sorted))
	for i, r := range sorted {
		for _, a := range r.Current {
			a = a.Unmap()
			if !slices.Contains(r.Families, a.Is4()) {
				continue
			}
			if owner, taken := p.used[a]; taken {
				p.event(r.Key, true, ReasonConflict, "ingress IP %s is already assigned to Service %s; allocating another one", a, owner)
				continue
			}
			// Addresses outside every pool were set by someone else (an operator, an older
			// config): keep them, they are not ours to take back.
			p.used[a] = r.Key
			kept[i] = append(kept[i], a)
		}
	}
	// External IPs next: an allocation must not hand out an address a Service already
	// serves, though a held ingress IP wins over it.
	for _, r := range sorted {
		for _, a := range r.Reserved {
			if _, taken := p.used[a.Unmap()]; !taken {
				p.used[a.Unmap()] = r.Key
			}
		}
	}
	decisions := make([]Decision, 0, len(sorted))
	for i, r := range sorted {
		decisions = append(decisions, p.decide(r, kept[i]))
	}
	return decisions, p.events
}

func (p *planner) event(key string, warning bool, reason, format string, args ...any) {
	p.events = append(p.events, Event{Key: key, Warning: warning, Reason: reason, Message: fmt.Sprintf(format, args...)})
}

// decide gives one Service its addresses, family by family.
func (p *planner) decide(r Request, kept []netip.Addr) Decision {
	d := Decision{Key: r.Key}
	var ips, fresh []netip.Addr
	var events []Event
	var failure *Event
	fail := func(reason, format string, args ...any) {
		e := Event{Key: r.Key, Warning: true, Reason: reason, Message: fmt.Sprintf(format, args...)}
		events = append(events, e)
		if failure == nil {
			failure = &e
		}
	}
	note := func(reason, format string, args ...any) {
		events = append(events, Event{Key: r.Key, Reason: reason, Message: fmt.Sprintf(format, args...)})
	}
	if r.WantedError != "" {
		fail(ReasonInvalidRequestedIP, "%s", r.WantedError)
	}
	var moving []string
	for _, v4 := range r.Families {
		curs := ofFamily(kept, v4)
		wants := ofFamily(unmapAll(r.Wanted), v4)
		switch {
		case len(wants) > 0 && slices.Contains(curs, wants[0]):
			want := wants[0]
			old := slices.DeleteFunc(slices.Clone(curs), func(a netip.Addr) bool { return a == want })
			ips = append(ips, want)
			switch {
			case len(old) == 0:
			case slices.Contains(r.Programmed, want):
				for _, a := range old {
					delete(p.used, a)
				}
				note(ReasonReleased, "released %s: the requested %s is programmed", joinAddrs(old), want)
			default:
				ips = append(ips, old...)
				moving = append(moving, fmt.Sprintf("from %s to %s", joinAddrs(old), want))
			}
		case len(wants) > 0:
			want := wants[0]
			if why, reason := p.refuse(r, want); why != "" {
				fail(reason, "%s", why)
				ips = append(ips, curs...) // keep serving what works
				continue
			}
			p.used[want] = r.Key
			ips = append(ips, want)
			if len(curs) == 0 {
				fresh = append(fresh, want)
				note(ReasonAllocated, "assigned %s (requested)", want)
				continue
			}
			ips = append(ips, curs...)
			moving = append(moving, fmt.Sprintf("from %s to %s", joinAddrs(curs), want))
			note(ReasonMoving, "moving from %s to the requested %s: the old address is released once lbd has programmed the new one", joinAddrs(curs), want)
		case len(curs) > 0:
			ips = append(ips, curs...)
		default:
			a, why := p.allocate(r, v4)
			if why != "" {
				fail(ReasonFailed, "%s", why)
				continue
			}
			p.used[a] = r.Key
			ips = append(ips, a)
			fresh = append(fresh, a)
			note(ReasonAllocated, "assigned %s", a)
		}
	}
	complete := len(familiesOf(ips)) == len(r.Families)
	if r.RequireDualStack && !complete && len(fresh) > 0 {
		// All or nothing: an address allocated now is not handed out alone.
		for _, a := range fresh {
			delete(p.used, a)
		}
		ips = slices.DeleteFunc(ips, func(a netip.Addr) bool { return slices.Contains(fresh, a) })
		events = slices.DeleteFunc(events, func(e Event) bool { return e.Reason == ReasonAllocated })
		fail(ReasonDualStack, "ipFamilyPolicy RequireDualStack: %s; no address of either family is assigned until both can be", failure.Message)
		failure = &events[len(events)-1]
	}
	p.events = append(p.events, events...)
	// Keep the Service's family order so the status reads like its ipFamilies.
	slices.SortStableFunc(ips, func(a, b netip.Addr) int {
		return slices.Index(r.Families, a.Is4()) - slices.Index(r.Families, b.Is4())
	})
	d.IPs = ips
	d.Changed = !slices.Equal(ips, unmapAll(r.Current))
	switch {
	case failure != nil:
		d.Reason, d.Message = failure.Reason, failure.Message
	case len(moving) > 0:
		d.Allocated, d.Reason = true, ReasonMoving
		d.Message = fmt.Sprintf("moving %s: the old address is released once lbd has programmed the new one", strings.Join(moving, "; "))
	default:
		d.Allocated, d.Reason = true, ReasonAllocated
		d.Message = "assigned " + joinAddrs(ips)
	}
	return d
}

// refuse says why a requested address cannot be given to r ("" if it can), and the
// reason word.
func (p *planner) refuse(r Request, w netip.Addr) (string, string) {
	switch pool := p.poolOf(w); {
	case pool == nil:
		return fmt.Sprintf("requested IP %s is in no configured pool", w), ReasonFailed
	case r.Pool != "" && pool.Name != r.Pool:
		return fmt.Sprintf("requested IP %s is in pool %q, not in the requested pool %q", w, pool.Name, r.Pool), ReasonFailed
	}
	if owner, taken := p.used[w]; taken && owner != r.Key {
		return fmt.Sprintf("requested IP %s is already assigned to Service %s", w, owner), ReasonConflict
	}
	return "", ""
}

func (p *planner) poolOf(a netip.Addr) *Pool {
	for _, pool := range p.pools {
		if pool.Contains(a) {
			return pool
		}
	}
	return nil
}

// allocate picks the first free address of one family from r's pool or the auto-assign
// pools, or says why there is none.
func (p *planner) allocate(r Request, v4 bool) (netip.Addr, string) {
	var candidates []*Pool
	for _, pool := range p.pools {
		if (r.Pool == "" && pool.AutoAssign) || pool.Name == r.Pool {
			candidates = append(candidates, pool)
		}
	}
	if r.Pool != "" && len(candidates) == 0 {
		return netip.Addr{}, fmt.Sprintf("no pool named %q", r.Pool)
	}
	for _, pool := range candidates {
		if a, ok := pool.firstFree(v4, p.used); ok {
			return a, ""
		}
	}
	names := make([]string, 0, len(candidates))
	for _, pool := range candidates {
		names = append(names, pool.Name)
	}
	return netip.Addr{}, fmt.Sprintf("no free %s address in pools %v", familyName(v4), names)
}

// ofFamily returns the addresses of one family, in order.
func ofFamily(as []netip.Addr, v4 bool) []netip.Addr {
	var out []netip.Addr
	for _, a := range as {
		if a.Is4() == v4 {
			out = append(out, a)
		}
	}
	return out
}

func familiesOf(as []netip.Addr) map[bool]bool {
	out := map[bool]bool{}
	for _, a := range as {
		out[a.Is4()] = true
	}
	return out
}

func familyName(v4 bool) string {
	if v4 {
		return "IPv4"
	}
	return "IPv6"
}

func joinAddrs(as []netip.Addr) string {
	s := make([]string, len(as))
	for i, a := range as {
		s[i] = a.String()
	}
	return strings.Join(s, ", ")
}

func unmapAll(as []netip.Addr) []netip.Addr {
	out := make([]netip.Addr, len(as))
	for i, a := range as {
		out[i] = a.Unmap()
	}
	return out
}
