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
	// Current are the IPs in status.loadBalancer.ingress.
	Current []netip.Addr
	// Wanted are specific addresses asked for (spec.loadBalancerIP); each must lie in a pool.
	Wanted []netip.Addr
	// Pool names the pool to allocate from; empty means any auto-assign pool.
	Pool string
}

// Decision is the ingress IPs a Service should have.
type Decision struct {
	Key string
	IPs []netip.Addr
	// Changed is true when IPs differ from the request's Current: status must be written.
	Changed bool
}

// Event is something the allocator tells the Service's users, as a Kubernetes Event.
type Event struct {
	Key     string
	Warning bool
	// Reason is a CamelCase word; Message says what happened and what to do.
	Reason  string
	Message string
}

// Plan decides the ingress IPs of every request. Addresses a Service already has are kept
// (older Services first, so a conflict moves the newer one); only then are missing families
// allocated, lowest free address first, so a restarted or newly elected allocator never
// reshuffles working VIPs. Addresses of deleted Services are free because nothing holds
// them.
func Plan(reqs []Request, pools []*Pool) ([]Decision, []Event) {
	sorted := slices.Clone(reqs)
	slices.SortFunc(sorted, func(a, b Request) int {
		return cmp.Or(a.Created.Compare(b.Created), strings.Compare(a.Key, b.Key))
	})
	used := map[netip.Addr]string{}
	inPool := func(a netip.Addr) *Pool {
		for _, p := range pools {
			if p.Contains(a) {
				return p
			}
		}
		return nil
	}
	var events []Event
	event := func(key string, warning bool, reason, format string, args ...any) {
		events = append(events, Event{Key: key, Warning: warning, Reason: reason, Message: fmt.Sprintf(format, args...)})
	}
	kept := make([][]netip.Addr, len(sorted))
	for i, r := range sorted {
		for _, a := range r.Current {
			a = a.Unmap()
			if !slices.Contains(r.Families, a.Is4()) {
				continue
			}
			if owner, taken := used[a]; taken {
				event(r.Key, true, "IPConflict", "ingress IP %s is already assigned to Service %s; allocating another one", a, owner)
				continue
			}
			// Addresses outside every pool were set by someone else (an operator, an older
			// config): keep them, they are not ours to take back.
			used[a] = r.Key
			kept[i] = append(kept[i], a)
		}
	}
	decisions := make([]Decision, 0, len(sorted))
	for i, r := range sorted {
		ips := kept[i]
		for _, v4 := range r.Families {
			if slices.ContainsFunc(ips, func(a netip.Addr) bool { return a.Is4() == v4 }) {
				continue
			}
			a, ok := allocate(r, v4, pools, used, inPool, event)
			if !ok {
				continue
			}
			used[a] = r.Key
			ips = append(ips, a)
			event(r.Key, false, "IPAllocated", "assigned %s", a)
		}
		// Keep the Service's family order so the status reads like its ipFamilies.
		slices.SortStableFunc(ips, func(a, b netip.Addr) int {
			return slices.Index(r.Families, a.Is4()) - slices.Index(r.Families, b.Is4())
		})
		decisions = append(decisions, Decision{Key: r.Key, IPs: ips, Changed: !slices.Equal(ips, unmapAll(r.Current))})
	}
	return decisions, events
}

// allocate picks an address of one family for r: the one it asks for, else the first free
// one of its pool or of the auto-assign pools.
func allocate(r Request, v4 bool, pools []*Pool, used map[netip.Addr]string, inPool func(netip.Addr) *Pool,
	event func(string, bool, string, string, ...any)) (netip.Addr, bool) {
	family := "IPv6"
	if v4 {
		family = "IPv4"
	}
	for _, w := range r.Wanted {
		w = w.Unmap()
		if w.Is4() != v4 {
			continue
		}
		switch p := inPool(w); {
		case p == nil:
			event(r.Key, true, "AllocationFailed", "requested IP %s is in no configured pool", w)
			return netip.Addr{}, false
		case r.Pool != "" && p.Name != r.Pool:
			event(r.Key, true, "AllocationFailed", "requested IP %s is in pool %q, not in the requested pool %q", w, p.Name, r.Pool)
			return netip.Addr{}, false
		}
		if owner, taken := used[w]; taken {
			event(r.Key, true, "IPConflict", "requested IP %s is already assigned to Service %s", w, owner)
			return netip.Addr{}, false
		}
		return w, true
	}
	var candidates []*Pool
	for _, p := range pools {
		if (r.Pool == "" && p.AutoAssign) || p.Name == r.Pool {
			candidates = append(candidates, p)
		}
	}
	if r.Pool != "" && len(candidates) == 0 {
		event(r.Key, true, "AllocationFailed", "no pool named %q", r.Pool)
		return netip.Addr{}, false
	}
	for _, p := range candidates {
		if a, ok := p.firstFree(v4, used); ok {
			return a, true
		}
	}
	names := make([]string, 0, len(candidates))
	for _, p := range candidates {
		names = append(names, p.Name)
	}
	event(r.Key, true, "AllocationFailed", "no free %s address in pools %v", family, names)
	return netip.Addr{}, false
}

func unmapAll(as []netip.Addr) []netip.Addr {
	out := make([]netip.Addr, len(as))
	for i, a := range as {
		out[i] = a.Unmap()
	}
	return out
}
