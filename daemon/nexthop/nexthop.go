//go:build linux

package nexthop

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

// Path is how this host reaches one backend node.
type Path struct {
	// Node is the backend node: the outer destination of the encapsulated packets.
	Node netip.Addr
	// Reachable is true when a unicast route exists, its interface is up with a
	// carrier, and its next hop has not failed (see the package documentation).
	Reachable bool
	// Reason says why, for people: "via 198.18.0.1 dev eth1 src 198.18.0.11,
	// neighbour REACHABLE (managed)", "no route to backend node 198.18.0.22", "next hop
	// 198.18.0.22 dev eth1 does not answer (neighbour FAILED)".
	Reason string
	// NextHop is the route's gateway, or Node itself when it is on-link. Invalid
	// without a route.
	NextHop netip.Addr
	// Interface is the egress interface's name; "" without a route.
	Interface string
	// Ifindex is the egress interface's index; 0 without a route.
	Ifindex int
	// Source is the route's preferred source, the address the kernel would send from
	// toward Node; invalid if there is none.
	Source netip.Addr
	// Neighbour is the NUD state of the next hop's entry: "REACHABLE", "STALE",
	// "DELAY", "PROBE", "INCOMPLETE", "FAILED", "PERMANENT", "NOARP", or "NONE" when
	// there is no entry.
	Neighbour string
	// Managed is true when the entry is a managed one this tracker keeps resolved.
	Managed bool
}

// Options configure a Tracker. The zero value works.
type Options struct {
	// Logger receives created and deleted entries, reachability changes and problems
	// (key/value pairs with an "op" field). Nil: no logs.
	Logger hclog.Logger
	// RecordPath is a file that lists the neighbour entries the tracker created (JSON:
	// interface name and address), replaced atomically, so that a restarted daemon
	// deletes those it no longer needs. "": the list lives in memory only.
	RecordPath string
	// OnChange is called from Run's goroutine, never concurrently, with a copy of all
	// paths after any of them changed (reachability, next hop, source, interface,
	// neighbour state), or a node came or went.
	OnChange func(paths map[netip.Addr]Path)
	// Resync is the interval of the safety resolution that catches what notifications
	// missed (default 30 s); notifications drive normal operation.
	Resync time.Duration
}

const (
	defaultResync = 30 * time.Second
	// debounce gathers the burst of notifications one change causes (a link going down
	// takes routes, addresses and neighbours with it) into one resolution.
	debounce = 50 * time.Millisecond
	// resubscribeDelay paces new subscriptions after a netlink socket failed (usually
	// ENOBUFS after a burst), so that a lasting failure does not spin.
	resubscribeDelay = 250 * time.Millisecond
)

// Tracker keeps the next hops toward a set of backend nodes resolved and reports a
// Path per node. Its methods may be called from any goroutine.
type Tracker struct {
	log        hclog.Logger
	ns         netns.NsHandle // the namespace of New's caller, where every socket is opened
	recordPath string
	onChange   func(map[netip.Addr]Path)
	resync     time.Duration
	wake       chan struct{} // asks Run to resolve again (capacity 1: requests coalesce)
	running    atomic.Bool

	mu       sync.Mutex
	nodes    []netip.Addr // sorted, replaced (never modified) by SetNodes
	nodesSet bool         // SetNodes was called: entries not needed by nodes may go
	paths    map[netip.Addr]Path
	hops     map[nhKey]bool // next hops in use: the neighbour notifications that matter

	// opMu serialises changes to neighbour entries and the record (Run's resolutions
	// and Release); it guards the fields below.
	opMu      sync.Mutex
	owned     map[nhKey]string // entries this tracker created or adopted → interface name
	pending   []recordEntry    // recorded entries whose interface was not looked up yet
	dirty     bool             // owned or pending changed since the record was written
	failed    map[nhKey]bool   // next hops whose entry went FAILED and has not answered since
	poked     map[nhKey]bool   // next hops nudged already (kernels without managed entries)
	noManaged bool             // the kernel refused managed entries: stop asking
}

// New returns a Tracker for the network namespace of the calling thread. It reads
// the record of a previous run, whose entries become the tracker's.
func New(opts Options) (*Tracker, error) {
	entries, err := readRecord(opts.RecordPath)
	if err != nil {
		return nil, err
	}
	ns, err := netns.Get()
	if err != nil {
		return nil, fmt.Errorf("get network namespace: %w", err)
	}
	t := &Tracker{
		log:        opts.Logger,
		ns:         ns,
		recordPath: opts.RecordPath,
		onChange:   opts.OnChange,
		resync:     opts.Resync,
		wake:       make(chan struct{}, 1),
		paths:      map[netip.Addr]Path{},
		owned:      map[nhKey]string{},
		pending:    entries,
		failed:     map[nhKey]bool{},
		poked:      map[nhKey]bool{},
	}
	if t.log == nil {
		t.log = hclog.NewNullLogger()
	}
	if t.resync <= 0 {
		t.resync = defaultResync
	}
	// The API has no Close: the namespace handle goes with the Tracker.
	runtime.AddCleanup(t, func(ns netns.NsHandle) { ns.Close() }, ns)
	return t, nil
}

// SetNodes replaces the set of backend nodes to track and wakes Run; calling it with
// the same set again costs nothing. A node's Path appears after Run resolved it.
// Until the first call, Run deletes no entry adopted from the record: the daemon
// may start Run before it knows its nodes.
func (t *Tracker) SetNodes(nodes []netip.Addr) {
	set := make([]netip.Addr, 0, len(nodes))
	for _, n := range nodes {
		if n.IsValid() {
			set = append(set, n.Unmap().WithZone(""))
		}
	}
	slices.SortFunc(set, netip.Addr.Compare)
	set = slices.Compact(set)
	t.mu.Lock()
	same := t.nodesSet && slices.Equal(t.nodes, set)
	t.nodes, t.nodesSet = set, true
	t.mu.Unlock()
	if !same {
		t.kick()
	}
}

// Paths returns a copy of the current paths, one per node resolved so far.
func (t *Tracker) Paths() map[netip.Addr]Path {
	t.mu.Lock()
	defer t.mu.Unlock()
	return maps.Clone(t.paths)
}

// Run follows the kernel's notifications and resolves the paths until ctx ends; it
// returns nil then, with every goroutine and socket it started gone. Only one Run may
// be active at a time.
func (t *Tracker) Run(ctx context.Context) error {
	if !t.running.CompareAndSwap(false, true) {
		return errors.New("run next-hop tracker: already running")
	}
	defer t.running.Store(false)
	h, err := netlink.NewHandleAt(t.ns)
	if err != nil {
		return fmt.Errorf("open netlink handle: %w", err)
	}
	defer h.Close()

	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	t.follow(ctx, &wg)

	resync := time.NewTicker(t.resync)
	defer resync.Stop()
	var fire <-chan time.Time // non-nil while a resolution is due
	t.publish(t.resolve(h, false))
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.wake:
			if fire == nil {
				fire = time.After(debounce)
			}
		case <-fire:
			fire = nil
			t.publish(t.resolve(h, false))
		case <-resync.C:
			t.publish(t.resolve(h, true))
		}
	}
}

// kick asks Run to resolve again soon.
func (t *Tracker) kick() {
	select {
	case t.wake <- struct{}{}:
	default:
	}
}

// publish makes paths the current ones and tells OnChange if they differ.
func (t *Tracker) publish(paths map[netip.Addr]Path) {
	t.mu.Lock()
	old := t.paths
	t.paths = paths
	t.mu.Unlock()
	if maps.Equal(old, paths) {
		return
	}
	for node, p := range paths {
		if o, ok := old[node]; !ok || o.Reachable != p.Reachable {
			lvl := hclog.Info
			if !p.Reachable {
				lvl = hclog.Warn
			}
			t.log.Log(lvl, "backend node path", "op", "resolve", "node", node, "reachable", p.Reachable, "reason", p.Reason)
		}
	}
	if t.onChange != nil {
		t.onChange(maps.Clone(paths))
	}
}

// Release deletes every neighbour entry the tracker created or adopted, if it is still
// a managed entry, and clears the record. It is for a datapath detached for good;
// call it after Run returned, or Run creates the entries again.
func (t *Tracker) Release(ctx context.Context) error {
	h, err := netlink.NewHandleAt(t.ns)
	if err != nil {
		return fmt.Errorf("open netlink handle: %w", err)
	}
	defer h.Close()
	t.opMu.Lock()
	defer t.opMu.Unlock()
	t.adopt(h)
	rs := newPass(h)
	var errs []error
	for k, name := range t.owned {
		if err := ctx.Err(); err != nil {
			errs = append(errs, fmt.Errorf("release neighbour entries: %w", err))
			break
		}
		if err := t.unmanage(rs, k, name); err != nil {
			errs = append(errs, err)
		}
	}
	if err := t.saveRecord(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}
