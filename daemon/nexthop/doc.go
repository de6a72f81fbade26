//go:build linux

// Package nexthop keeps the next hops toward backend nodes resolved and says, per
// backend node, whether this host can forward to it: the route, the next hop and its
// neighbour entry, and a reason an operator can read.
//
// The XDP program on an LB node sends Geneve packets to backend nodes after a
// bpf_fib_lookup, which answers NO_NEIGH while the next hop has no resolved neighbour
// entry, as on a freshly booted host. A Tracker therefore makes sure each next hop in
// use has a managed neighbour entry (NTF_EXT_MANAGED, Linux 5.16+), which the kernel
// resolves at once and keeps resolved without traffic, and it reports which nodes can
// be reached so that the daemon never advertises a VIP it cannot forward.
//
// # Paths
//
// For each node, the kernel's route lookup (RTM_GETROUTE, in the tracker's network
// namespace) gives the egress interface, the gateway (or the node itself when on-link)
// and the preferred source. A node is reachable when a unicast route exists, its
// interface is up with a carrier, and its next hop has not failed. An INCOMPLETE
// entry, or none yet, counts as reachable: the XDP program hands such packets to the
// kernel, which resolves the neighbour and forwards them. A next hop whose entry went
// FAILED stays unreachable until its entry holds a link-layer address again: the
// kernel re-probes a failed managed entry every interval_probe_time_ms, passing through
// INCOMPLETE each time without telling anyone, and a node must not flap back into
// being advertised on every probe.
//
// # Neighbour entries
//
// A PERMANENT or NOARP entry is never touched (someone configured it), nor is a
// managed entry the tracker did not create. A dynamic entry the kernel learned is
// turned into a managed one, and a missing one is created, the way `ip neigh add ADDR
// dev DEV managed` does (no state, no link-layer address: the kernel starts it
// INCOMPLETE and probes). Both become the tracker's, and are deleted, if they are still
// managed, when no node needs them any more. Options.RecordPath keeps the list across
// restarts, so that a new daemon adopts the entries of the old one and deletes those
// it no longer needs; Release deletes them all when the datapath goes for good.
//
// On a kernel without managed entries the tracker logs one warning and goes on
// computing paths. Next hops then resolve the classic way: a packet the XDP program
// hands to the kernel makes it resolve the neighbour and forward the packet. The
// tracker nudges (NTF_USE) a missing or FAILED next hop when it first sees it and
// then every Resync, so that a node that failed once is found again even when no
// traffic goes its way.
//
// # Events
//
// Run follows route, address, link and neighbour notifications (the last only for the
// next hops in use) and resolves again 50 ms after the first of a burst; it also
// resolves every Resync as a safety net. A Tracker works in the network namespace of
// the thread that called New, whatever thread Run and Release later run on.
//
// Only the next hop the kernel picks for the node is managed: with a multipath route,
// the other next hops are resolved by the kernel when the XDP program's lookup picks
// them and passes the packet up.
package nexthop
