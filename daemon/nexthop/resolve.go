//go:build linux

package nexthop

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// nhKey names a neighbour entry: a next hop's address on one interface.
type nhKey struct {
	ifindex int
	addr    netip.Addr
}

// table names one neighbour table dump: an interface and an address family.
type table struct {
	ifindex int
	family  int
}

func (k nhKey) table() table {
	if k.addr.Is4() {
		return table{k.ifindex, unix.AF_INET}
	}
	return table{k.ifindex, unix.AF_INET6}
}

// pass caches what one resolution read from the kernel, so that each interface and
// each neighbour table is read once however many nodes share them.
type pass struct {
	h      *netlink.Handle
	links  map[int]netlink.Link
	tables map[table][]netlink.Neigh
}

func newPass(h *netlink.Handle) *pass {
	return &pass{h: h, links: map[int]netlink.Link{}, tables: map[table][]netlink.Neigh{}}
}

func (rs *pass) link(ifindex int) (netlink.Link, error) {
	if l, ok := rs.links[ifindex]; ok {
		return l, nil
	}
	l, err := rs.h.LinkByIndex(ifindex)
	if err != nil {
		return nil, fmt.Errorf("get interface %d: %w", ifindex, err)
	}
	rs.links[ifindex] = l
	return l, nil
}

// neigh returns k's entry, and whether there is one.
func (rs *pass) neigh(k nhKey) (netlink.Neigh, bool, error) {
	tb := k.table()
	list, ok := rs.tables[tb]
	if !ok {
		var err error
		list, err = rs.h.NeighList(tb.ifindex, tb.family)
		if errors.Is(err, netlink.ErrDumpInterrupted) {
			// The table changed during the dump: one more try gets a consistent one.
			list, err = rs.h.NeighList(tb.ifindex, tb.family)
		}
		if err != nil {
			return netlink.Neigh{}, false, fmt.Errorf("list neighbours of interface %d: %w", tb.ifindex, err)
		}
		rs.tables[tb] = list
	}
	for _, n := range list {
		if a, ok := netip.AddrFromSlice(n.IP); ok && a.Unmap() == k.addr {
			return n, true, nil
		}
	}
	return netlink.Neigh{}, false, nil
}

// forget drops k's table from the cache after the tracker changed it.
func (rs *pass) forget(k nhKey) { delete(rs.tables, k.table()) }

func isManaged(n netlink.Neigh) bool { return n.FlagsExt&netlink.NTF_EXT_MANAGED != 0 }

func isStatic(n netlink.Neigh) bool { return n.State&(unix.NUD_PERMANENT|unix.NUD_NOARP) != 0 }

// resolve works out every node's path, makes sure the next hops in use have managed
// entries and deletes the tracker's entries no node needs. periodic marks the safety
// resolution, the one that nudges failed next hops on kernels without managed entries.
func (t *Tracker) resolve(h *netlink.Handle, periodic bool) map[netip.Addr]Path {
	t.mu.Lock()
	nodes, nodesSet := t.nodes, t.nodesSet
	t.mu.Unlock()

	t.opMu.Lock()
	defer t.opMu.Unlock()
	t.adopt(h)
	rs := newPass(h)
	paths := make(map[netip.Addr]Path, len(nodes))
	hops := map[nhKey]bool{}
	for _, node := range nodes {
		p, ok := route(rs, node)
		paths[node] = p
		if ok {
			hops[nhKey{p.Ifindex, p.NextHop}] = true
		}
	}

	// Before any change, so that the notifications of the entries about to be
	// created already count.
	t.mu.Lock()
	t.hops = hops
	t.mu.Unlock()

	created := map[nhKey]bool{}
	for k := range hops {
		if t.ensure(rs, k, periodic) {
			created[k] = true
		}
	}
	if nodesSet {
		for k, name := range t.owned {
			if !hops[k] {
				// A failure is logged; the next resolution tries again.
				_ = t.unmanage(rs, k, name)
			}
		}
	}

	failed := map[nhKey]bool{}
	for node, p := range paths {
		if p.Ifindex == 0 {
			continue
		}
		k := nhKey{p.Ifindex, p.NextHop}
		n := t.observe(rs, k, created[k])
		if judge(&p, rs.links[k.ifindex].Attrs().RawFlags, n, t.failed[k]) {
			failed[k] = true
		}
		paths[node] = p
	}
	t.failed = failed
	for k := range t.poked {
		if !hops[k] {
			delete(t.poked, k)
		}
	}
	if err := t.saveRecord(); err != nil {
		t.log.Warn("neighbour record not written; next resolution tries again", "op", "record", "error", err)
	}
	return paths
}

// route fills in node's route; false when there is no usable one (p.Reason says why).
func route(rs *pass, node netip.Addr) (Path, bool) {
	p := Path{Node: node}
	routes, err := rs.h.RouteGet(node.AsSlice())
	if err != nil || len(routes) == 0 {
		p.Reason = noRoute(node, err)
		return p, false
	}
	r := routes[0]
	if r.Type != unix.RTN_UNICAST {
		p.Reason = fmt.Sprintf("no unicast route to backend node %s (route type %s)", node, routeType(r.Type))
		return p, false
	}
	p.NextHop = node
	if gw, ok := netip.AddrFromSlice(r.Gw); ok {
		p.NextHop = gw.Unmap()
	} else if via, ok := r.Via.(*netlink.Via); ok {
		// An IPv4 route via an IPv6 next hop (RFC 5549), as BGP unnumbered installs.
		if a, ok := netip.AddrFromSlice(via.Addr); ok {
			p.NextHop = a.Unmap()
		}
	}
	l, err := rs.link(r.LinkIndex)
	if err != nil {
		p.NextHop = netip.Addr{}
		p.Reason = fmt.Sprintf("no usable route to backend node %s: %v", node, err)
		return p, false
	}
	p.Ifindex, p.Interface = r.LinkIndex, l.Attrs().Name
	if src, ok := netip.AddrFromSlice(r.Src); ok {
		p.Source = src.Unmap()
	}
	return p, true
}

// canResolve says whether next hops on l have entries to keep resolved: devices
// without ARP or neighbour discovery have none, and an interface that is down or has
// no carrier loses its entries anyway.
func canResolve(l netlink.Link) bool {
	f := l.Attrs().RawFlags
	return f&(unix.IFF_NOARP|unix.IFF_LOOPBACK) == 0 && f&unix.IFF_UP != 0 && f&unix.IFF_RUNNING != 0
}

// ensure gives next hop k a managed entry, following the ownership rules of the
// package documentation. It returns true when it created or converted the entry.
func (t *Tracker) ensure(rs *pass, k nhKey, periodic bool) bool {
	n, found, err := rs.neigh(k)
	if err != nil {
		t.log.Warn("next hop not managed", "op", "manage-neighbour", "next_hop", k.addr, "error", err)
		return false
	}
	name := rs.links[k.ifindex].Attrs().Name
	switch {
	case found && isStatic(n):
		if _, ok := t.owned[k]; ok {
			// Someone made it static: theirs now, and never to be deleted by us.
			delete(t.owned, k)
			t.dirty = true
		}
		return false
	case found && isManaged(n):
		if old, ok := t.owned[k]; ok && old != name {
			t.owned[k] = name // the interface was renamed
			t.dirty = true
		}
		return false
	case !canResolve(rs.links[k.ifindex]):
		return false
	case t.noManaged:
		t.nudge(rs, k, n, found, periodic)
		return false
	}
	want := &netlink.Neigh{LinkIndex: k.ifindex, IP: k.addr.AsSlice(), FlagsExt: netlink.NTF_EXT_MANAGED}
	if found {
		// Replacing keeps the learned link-layer address and state, and adds the flag.
		err = rs.h.NeighSet(want)
	} else {
		err = rs.h.NeighAdd(want)
	}
	rs.forget(k)
	switch {
	case errors.Is(err, unix.EINVAL) || errors.Is(err, unix.EOPNOTSUPP):
		t.managedUnsupported(err)
		return false
	case errors.Is(err, unix.EEXIST):
		// Created by someone else since the dump: the next resolution looks again.
		t.kick()
		return false
	case err != nil:
		t.log.Warn("managed neighbour entry not created", "op", "manage-neighbour", "next_hop", k.addr, "interface", name, "error", err)
		return false
	}
	t.owned[k] = name
	t.dirty = true
	how := "created"
	if found {
		how = "converted from " + nudName(n.State)
	}
	t.log.Info("managed neighbour entry "+how, "op", "manage-neighbour", "next_hop", k.addr, "interface", name)
	return true
}

// observe reads k's entry as resolution leaves it. created marks an entry ensure
// just made managed: if the flag did not stick, the kernel predates managed entries.
func (t *Tracker) observe(rs *pass, k nhKey, created bool) neighbour {
	n, found, err := rs.neigh(k)
	if err != nil || !found {
		return neighbour{}
	}
	_, owned := t.owned[k]
	if created && !isManaged(n) {
		t.managedUnsupported(errors.New("the kernel ignored NTF_EXT_MANAGED"))
		delete(t.owned, k)
		t.dirty = true
		owned = false
	}
	return neighbour{
		state:     n.State,
		ours:      owned && isManaged(n),
		elsewhere: !owned && isManaged(n),
	}
}

// nudge asks the kernel to resolve a next hop (NTF_USE) on kernels without managed
// entries: a missing or FAILED entry is otherwise only probed when a packet needs it,
// and a node that is not advertised gets no packets. It does so when it first sees
// the next hop and then on the Resync resolutions, not on every notification.
func (t *Tracker) nudge(rs *pass, k nhKey, n netlink.Neigh, found, periodic bool) {
	if found && n.State != unix.NUD_FAILED {
		return
	}
	if t.poked[k] && !periodic {
		return
	}
	t.poked[k] = true
	err := rs.h.NeighSet(&netlink.Neigh{LinkIndex: k.ifindex, IP: k.addr.AsSlice(), Flags: netlink.NTF_USE})
	rs.forget(k)
	if err != nil {
		t.log.Warn("next hop not probed", "op", "probe-neighbour", "next_hop", k.addr, "error", err)
	}
}

func (t *Tracker) managedUnsupported(err error) {
	if t.noManaged {
		return
	}
	t.noManaged = true
	t.log.Warn("this kernel has no managed neighbour entries (Linux 5.16+): next hops are not kept resolved; "+
		"packets to an unresolved next hop go through the kernel, which resolves it",
		"op", "manage-neighbour", "error", err)
}

// unmanage deletes the tracker's entry k if it is still a managed one, and forgets it
// unless the deletion failed.
func (t *Tracker) unmanage(rs *pass, k nhKey, name string) error {
	n, found, err := rs.neigh(k)
	if err == nil && found && isManaged(n) {
		err = rs.h.NeighDel(&netlink.Neigh{LinkIndex: k.ifindex, IP: k.addr.AsSlice()})
		rs.forget(k)
		if errors.Is(err, unix.ENOENT) {
			err = nil
		}
		if err == nil {
			t.log.Info("managed neighbour entry deleted", "op", "release-neighbour", "next_hop", k.addr, "interface", name)
		}
	}
	if err != nil {
		err = fmt.Errorf("delete neighbour entry %s dev %s: %w", k.addr, name, err)
		t.log.Warn("managed neighbour entry not deleted", "op", "release-neighbour", "error", err)
		return err
	}
	delete(t.owned, k)
	t.dirty = true
	return nil
}

// adopt makes the recorded entries the tracker's, now that their interfaces can be
// looked up in the tracker's namespace. An entry whose interface is gone went with it.
func (t *Tracker) adopt(h *netlink.Handle) {
	var keep []recordEntry
	for _, e := range t.pending {
		l, err := h.LinkByName(e.Interface)
		var notFound netlink.LinkNotFoundError
		switch {
		case errors.As(err, &notFound):
			t.dirty = true
		case err != nil:
			t.log.Warn("recorded neighbour entry not adopted yet", "op", "adopt-neighbour", "interface", e.Interface, "next_hop", e.Address, "error", err)
			keep = append(keep, e)
		default:
			t.owned[nhKey{l.Attrs().Index, e.Address}] = e.Interface
		}
	}
	t.pending = keep
}
