// Package advertise decides which VIPs this node advertises over BGP and keeps the
// embedded speaker (package bgp) in line with the desired state: it feeds the speaker
// the peers of the configuration file and of the API, hands it the full set of VIPs to
// announce after every relevant change (MetalLB style: the speaker diffs), and writes
// into every service's status whether its VIP is advertised and, if not, why.
//
// A VIP is advertised while at least one of its services qualifies: the node's
// datapath is attached, the node is not drained, and the service's advertise policy is
// ALWAYS or it has a usable backend.
//
// Stopping: Run returns when its context ends but leaves the speaker running. Before
// returning it deletes the peers that have no graceful restart session (they get a
// Cease NOTIFICATION and withdraw this node's routes at once) and keeps the others: when
// the process then exits without a NOTIFICATION, graceful-restart peers keep the routes
// through the restart, so a daemon restart does not change the routers' ECMP sets. To
// stop advertising for good (detach, decommission), call Withdraw after Run returned.
package advertise

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/lbd-dev/lbd/daemon/bgp"
	"github.com/lbd-dev/lbd/daemon/model"
	"github.com/lbd-dev/lbd/daemon/store"
	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
	"google.golang.org/grpc/codes"
)

const (
	// attachPoll is how often Run checks whether the datapath is still attached: the
	// datapath reports no event, and a detached node must stop attracting traffic soon.
	attachPoll = time.Second
	// retryInterval spaces retries of a pass that failed (a BGP stack error).
	retryInterval = 2 * time.Second
	// shutdownTimeout bounds the peer deletions at shutdown.
	shutdownTimeout = 5 * time.Second
)

// Controller keeps the speaker's peers and routes in line with the store.
type Controller struct {
	bgpCfg   bgp.Config // static peers only
	attrs    []attributes
	static   map[netip.Addr]bool
	st       *store.Store
	attached func() bool
	log      hclog.Logger
	wake     chan struct{}

	mu       sync.Mutex // guards services, written by the store listener
	services map[string]*model.Service

	// passMu serializes passes with Withdraw, so that no pass re-announces or rewrites
	// statuses after Withdraw.
	passMu sync.Mutex

	spMu      sync.Mutex
	speaker   *bgp.Speaker // nil until Run starts it and after Withdraw
	withdrawn bool

	stateMu     sync.Mutex                    // guards the results of the last pass
	vipServices map[netip.Prefix][]string     // desired prefixes and the services wanting them
	storePeers  map[netip.Addr]storePeerState // API peers handed to the speaker

	// qualified holds the services that wanted their VIP in the last pass (passMu): a
	// change on its way to the datapath does not withdraw them in between.
	qualified map[string]bool
}

// storePeerState is an API peer as last handed to the speaker.
type storePeerState struct {
	cfg bgp.PeerConfig
	// err says why the speaker refused the peer; nil when it runs.
	err error
}

// New validates cfg and returns a controller; Run starts the speaker. attached reports
// whether the node's datapath is attached (polled every second). restarting says that
// this start follows a graceful restart of the daemon (see bgp.Config.Restarting).
func New(cfg Config, st *store.Store, attached func() bool, restarting bool, logger hclog.Logger) (*Controller, error) {
	bc, attrs, err := cfg.compile(restarting)
	if err != nil {
		return nil, err
	}
	if logger == nil {
		logger = hclog.NewNullLogger()
	}
	static := make(map[netip.Addr]bool, len(bc.Peers))
	for _, p := range bc.Peers {
		static[p.Address] = true
	}
	return &Controller{
		bgpCfg:      bc,
		attrs:       attrs,
		static:      static,
		st:          st,
		attached:    attached,
		log:         logger,
		wake:        make(chan struct{}, 1),
		services:    map[string]*model.Service{},
		vipServices: map[netip.Prefix][]string{},
		storePeers:  map[netip.Addr]storePeerState{},
	}, nil
}

// Run starts the speaker with the static and API peers, then advertises until ctx
// ends. It returns nil after a normal stop, leaving the speaker running for the
// graceful-restart peers (see the package documentation); it returns an error if the
// speaker does not start.
func (c *Controller) Run(ctx context.Context) error {
	snap, _, unlisten := c.st.SnapshotAndListen(c.onEvents)
	defer unlisten()
	c.mu.Lock()
	for _, svc := range snap {
		c.services[svc.Spec.Name] = svc
	}
	c.mu.Unlock()

	// API peers join the start configuration so that they too learn from the OPEN that
	// this start is a graceful restart.
	cfg := c.bgpCfg
	cfg.Peers = slices.Clone(cfg.Peers)
	initial := c.wantedStorePeers(true)
	for _, addr := range sortedAddrs(initial) {
		if sp := initial[addr]; sp.err == nil {
			cfg.Peers = append(cfg.Peers, sp.cfg)
		}
	}
	sp, err := bgp.New(cfg, c.log.Named("speaker"))
	if err != nil {
		return fmt.Errorf("create BGP speaker: %w", err)
	}
	if err := sp.Start(ctx); err != nil {
		return err
	}
	// Peer state changes change the services' reasons ("advertised to 2 peers").
	if err := sp.WatchPeers(ctx, func(bgp.PeerEvent) { c.poke() }); err != nil {
		return errors.Join(fmt.Errorf("watch BGP peers: %w", err), sp.Stop(context.WithoutCancel(ctx)))
	}
	c.stateMu.Lock()
	c.storePeers = initial
	c.stateMu.Unlock()
	c.spMu.Lock()
	c.speaker = sp
	c.spMu.Unlock()

	poll := time.NewTicker(attachPoll)
	defer poll.Stop()
	wasAttached := c.attached()
	ok := c.pass(ctx, sp, wasAttached)
	lastTry := time.Now()
	for {
		select {
		case <-ctx.Done():
			c.shutdown(sp)
			return nil
		case <-c.wake:
		case <-poll.C:
			if c.attached() == wasAttached && (ok || time.Since(lastTry) < retryInterval) {
				continue
			}
		}
		wasAttached = c.attached()
		ok = c.pass(ctx, sp, wasAttached)
		lastTry = time.Now()
	}
}

// onEvents is the store listener: it must not block, so it records the change and
// wakes Run, which applies the latest state.
func (c *Controller) onEvents(evs []store.Event) {
	changed := false
	c.mu.Lock()
	for _, ev := range evs {
		// Status-only events matter too: a VIP waits until the datapath reports its
		// service programmed. Our own SetAdvertised calls come back here as well, but
		// the store emits them only on a change, so a pass that changes nothing ends
		// the exchange.
		switch {
		case ev.Type == store.Node:
			changed = true
		case ev.Type == store.Deleted:
			delete(c.services, ev.Name)
			changed = true
		default:
			c.services[ev.Name] = ev.Service
			changed = true
		}
	}
	c.mu.Unlock()
	if changed {
		c.poke()
	}
}

func (c *Controller) poke() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// pass brings the speaker in line with the current state and writes every service's
// advertise status. It reports whether everything was applied.
func (c *Controller) pass(ctx context.Context, sp *bgp.Speaker, attached bool) bool {
	c.passMu.Lock()
	defer c.passMu.Unlock()
	c.spMu.Lock()
	withdrawn := c.withdrawn
	c.spMu.Unlock()
	if withdrawn || ctx.Err() != nil {
		return true
	}
	ok := c.syncPeers(ctx, sp)

	drained := c.st.Drained()
	c.mu.Lock()
	svcs := make([]*model.Service, 0, len(c.services))
	for _, svc := range c.services {
		svcs = append(svcs, svc)
	}
	c.mu.Unlock()
	slices.SortFunc(svcs, func(a, b *model.Service) int { return strings.Compare(a.Spec.Name, b.Spec.Name) })

	verdicts := make(map[string]verdict, len(svcs))
	wanted := map[netip.Prefix][]string{}
	waiting := map[netip.Prefix]string{}
	for _, svc := range svcs {
		v := c.judge(svc, attached, drained)
		verdicts[svc.Spec.Name] = v
		if v.qualifies {
			wanted[v.prefix] = append(wanted[v.prefix], svc.Spec.Name)
		}
		if v.waiting {
			waiting[v.prefix] = svc.Spec.Name
		}
	}
	// A VIP goes on the wire only once every service on it is in the datapath: its
	// clients must not meet a service that refuses them. One already announced stays.
	c.stateMu.Lock()
	for p, names := range wanted {
		if _, announced := c.vipServices[p]; !announced && waiting[p] != "" {
			for _, name := range names {
				v := verdicts[name]
				v.qualifies, v.why = false, "waiting for the datapath to program service "+waiting[p]+" on the same VIP"
				verdicts[name] = v
			}
			delete(wanted, p)
		}
	}
	c.stateMu.Unlock()
	qualified := make(map[string]bool, len(svcs))
	for name, v := range verdicts {
		qualified[name] = v.qualifies
	}
	c.qualified = qualified
	routes := make([]bgp.Route, 0, len(wanted))
	for p := range wanted {
		routes = append(routes, route(p.Addr(), c.attrs))
	}
	_, setErr := sp.SetAdvertised(ctx, routes)
	if setErr != nil {
		ok = false
		c.log.Error("advertised routes not fully applied", "op", "set-advertised", "error", setErr)
	}
	c.stateMu.Lock()
	c.vipServices = wanted
	c.stateMu.Unlock()
	if ctx.Err() != nil {
		return true // stopping: the statuses would describe a half-applied state
	}

	established := map[bgp.Family]int{}
	peers, err := sp.ListPeers(ctx)
	if err != nil {
		ok = false
		c.log.Error("list BGP peers", "op", "advertise", "error", err)
	}
	for _, p := range peers {
		if p.State != bgp.StateEstablished {
			continue
		}
		for _, f := range p.Families {
			established[f.Family]++
		}
	}
	for _, svc := range svcs {
		adv, reason := verdicts[svc.Spec.Name].status(wanted, established, setErr)
		err := c.st.SetAdvertised(svc.Spec.Name, adv, reason)
		if err != nil && store.Code(err) != codes.NotFound {
			ok = false
			c.log.Error("record advertise status", "op", "advertise", "service", svc.Spec.Name, "error", err)
		}
	}
	return ok
}

// verdict is whether one service wants its VIP advertised.
type verdict struct {
	name      string
	prefix    netip.Prefix
	qualifies bool
	// waiting: the service is not in the datapath yet (and was not announced before).
	waiting bool
	// why the service does not qualify.
	why string
}

func (c *Controller) judge(ms *model.Service, attached, drained bool) verdict {
	svc := ms.Spec
	v := verdict{name: svc.Name}
	v.prefix = netip.PrefixFrom(ms.VIP, ms.VIP.BitLen())
	switch {
	case !attached:
		v.why = "datapath detached"
	case drained:
		v.why = "node is drained (lbctl node undrain)"
	case reachesNoBackendNode(svc):
		// Even an always-advertised VIP would only attract traffic this node cannot send on.
		v.why = "this node reaches none of the service's backend nodes (the service's status says why)"
	case svc.GetStatus().GetState() == lbdv1.ServiceState_SERVICE_STATE_PENDING && c.qualified[svc.Name]:
		// A change on its way to the datapath (a new revision, a backend's health)
		// keeps an announced VIP: withdrawing it for those milliseconds would only
		// churn the routers' ECMP sets.
		v.qualifies = true
	case svc.GetStatus().GetState() == lbdv1.ServiceState_SERVICE_STATE_PENDING:
		// Announcing before the Maglev table is in place would send clients to a VIP
		// that refuses them.
		v.why, v.waiting = "waiting for the datapath to program the service", true
	case svc.GetStatus().GetState() == lbdv1.ServiceState_SERVICE_STATE_ERROR:
		v.why = "the datapath could not program the service: " + svc.GetStatus().GetReason()
	case svc.AdvertisePolicy != lbdv1.AdvertisePolicy_ADVERTISE_POLICY_ALWAYS && svc.GetStatus().GetUsableBackends() == 0:
		v.why = "no usable backend (advertise policy if-healthy)"
	default:
		v.qualifies = true
	}
	return v
}

// reachesNoBackendNode reports whether a service has backends and this node can reach
// the node of none of those that take traffic.
func reachesNoBackendNode(svc *lbdv1.Service) bool {
	seen := false
	for _, b := range svc.Backends {
		if b.State == lbdv1.BackendState_BACKEND_STATE_DISABLED {
			continue
		}
		if b.NodeReachability != lbdv1.Reachability_REACHABILITY_UNREACHABLE {
			return false
		}
		seen = true
	}
	return seen
}

// status is the service's advertise status given the routes handed to the speaker,
// the established sessions per family and the speaker's error, if any.
func (v verdict) status(wanted map[netip.Prefix][]string, established map[bgp.Family]int, setErr error) (bool, string) {
	others, onWire := wanted[v.prefix]
	if !onWire {
		return false, "withdrawn: " + v.why
	}
	if setErr != nil {
		return false, "not advertised: the BGP speaker failed: " + setErr.Error()
	}
	fam := bgp.IPv4Unicast
	if v.prefix.Addr().Is6() {
		fam = bgp.IPv6Unicast
	}
	n := established[fam]
	if n == 0 {
		return false, fmt.Sprintf("not advertised: no BGP peer is established yet (%s)", fam)
	}
	to := fmt.Sprintf("advertised to %d established %s", n, plural(n, "peer", "peers"))
	if !v.qualifies {
		// Another service on the same VIP keeps it on the wire.
		return true, fmt.Sprintf("%s for service %s; this service alone would be withdrawn: %s",
			to, strings.Join(others, ", "), v.why)
	}
	return true, to
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

// syncPeers adds, updates and deletes the API peers that changed since the last pass.
// It reports whether the speaker took every change.
func (c *Controller) syncPeers(ctx context.Context, sp *bgp.Speaker) bool {
	want := c.wantedStorePeers(false)
	c.stateMu.Lock()
	have := c.storePeers
	c.stateMu.Unlock()
	next := make(map[netip.Addr]storePeerState, len(want))
	ok := true
	for _, addr := range sortedAddrs(have) {
		if _, keep := want[addr]; keep || have[addr].err != nil {
			continue
		}
		if err := sp.DeletePeer(ctx, addr); err != nil && !errors.Is(err, bgp.ErrPeerNotFound) {
			ok = false
			next[addr] = have[addr]
			c.log.Error("delete BGP peer", "op", "sync-peers", "peer", addr, "error", err)
		}
	}
	for _, addr := range sortedAddrs(want) {
		w, old := want[addr], have[addr]
		_, known := have[addr]
		switch {
		case w.err != nil:
			if known && old.err == nil {
				// The peer became invalid for the speaker: stop the old session.
				if err := sp.DeletePeer(ctx, addr); err != nil && !errors.Is(err, bgp.ErrPeerNotFound) {
					ok = false
					c.log.Error("delete BGP peer", "op", "sync-peers", "peer", addr, "error", err)
				}
			}
		case known && old.err == nil && samePeer(old.cfg, w.cfg):
		case known && old.err == nil:
			w.err = sp.UpdatePeer(ctx, w.cfg)
		default:
			w.err = sp.AddPeer(ctx, w.cfg)
			if errors.Is(w.err, bgp.ErrPeerExists) {
				// A failed update left the old session in place.
				w.err = sp.UpdatePeer(ctx, w.cfg)
			}
		}
		if w.err != nil && (!known || old.err == nil || old.err.Error() != w.err.Error()) {
			c.log.Error("BGP peer from the API not configured", "op", "sync-peers", "peer", addr, "error", w.err)
		}
		next[addr] = w
	}
	c.stateMu.Lock()
	c.storePeers = next
	c.stateMu.Unlock()
	return ok
}

// wantedStorePeers converts the store's peers; a peer the speaker would refuse carries
// the reason. Addresses of static peers are left out: the configuration file wins.
// With logShadowed, it logs those left out.
func (c *Controller) wantedStorePeers(logShadowed bool) map[netip.Addr]storePeerState {
	out := map[netip.Addr]storePeerState{}
	for _, p := range c.st.BgpPeers(true) {
		pc, err := c.peerFromStore(p)
		switch {
		case c.static[pc.Address]:
			if logShadowed {
				c.log.Warn("API peer ignored: the configuration file has a peer with this address",
					"op", "sync-peers", "peer", pc.Address)
			}
		default:
			out[pc.Address] = storePeerState{cfg: pc, err: err}
		}
	}
	return out
}

// peerFromStore converts an API peer; the error says why the speaker would refuse it.
func (c *Controller) peerFromStore(mp model.Peer) (bgp.PeerConfig, error) {
	p := mp.Spec
	pc := bgp.PeerConfig{
		Address:           mp.Addr,
		AS:                p.PeerAs,
		Port:              uint16(p.Port),
		Password:          p.Password,
		HoldTime:          p.GetHoldTime().AsDuration(),
		KeepaliveInterval: p.GetKeepaliveInterval().AsDuration(),
		EBGPMultihopTTL:   uint8(p.EbgpMultihopTtl),
		GracefulRestart:   bgp.GracefulRestartConfig{Enabled: p.GracefulRestart},
	}
	if p.GracefulRestart {
		pc.GracefulRestart.RestartTime = p.GetGracefulRestartTime().AsDuration()
	}
	pc.Families = defaultFamilies(pc.Address, c.bgpCfg)
	// The speaker validates a peer against the node's configuration; a one-peer copy of
	// it tells in advance whether AddPeer would refuse this one.
	probe := c.bgpCfg
	probe.Peers = []bgp.PeerConfig{pc}
	if err := probe.Validate(); err != nil {
		return pc, err
	}
	return pc, nil
}

func samePeer(a, b bgp.PeerConfig) bool {
	return a.Address == b.Address && a.AS == b.AS && a.Port == b.Port &&
		a.LocalAddress == b.LocalAddress && a.Password == b.Password &&
		a.HoldTime == b.HoldTime && a.KeepaliveInterval == b.KeepaliveInterval &&
		a.ConnectRetry == b.ConnectRetry && a.EBGPMultihopTTL == b.EBGPMultihopTTL &&
		a.Passive == b.Passive && a.GracefulRestart == b.GracefulRestart &&
		slices.Equal(a.Families, b.Families)
}

func sortedAddrs[V any](m map[netip.Addr]V) []netip.Addr {
	out := make([]netip.Addr, 0, len(m))
	for a := range m {
		out = append(out, a)
	}
	slices.SortFunc(out, func(a, b netip.Addr) int { return a.Compare(b) })
	return out
}

// shutdown prepares a plain stop: peers without a graceful restart session are
// deleted, so they withdraw this node's routes at once with a Cease NOTIFICATION; the
// others stay, and keep the routes through the restart once the process exits.
func (c *Controller) shutdown(sp *bgp.Speaker) {
	ctx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
	defer cancel()
	keep := map[netip.Addr]bool{}
	statuses, err := sp.ListPeers(ctx)
	if err != nil {
		c.log.Error("list BGP peers at shutdown; closing every session", "op", "shutdown", "error", err)
	}
	for _, st := range statuses {
		keep[st.Address] = st.State == bgp.StateEstablished && st.GracefulRestart
	}
	kept := 0
	for _, p := range sp.Peers() {
		if keep[p.Address] {
			kept++
			continue
		}
		if err := sp.DeletePeer(ctx, p.Address); err != nil {
			c.log.Error("close BGP session at shutdown", "op", "shutdown", "peer", p.Address, "error", err)
		}
	}
	c.log.Info("BGP sessions without graceful restart closed; the others keep this node's routes through the restart",
		"op", "shutdown", "kept", kept)
}

// Withdraw stops advertising for good: it withdraws every VIP, closes every session
// (BGP speaker Stop) and marks the services withdrawn. Use it when the datapath is
// detached or the node is leaving; call it after Run returned.
func (c *Controller) Withdraw(ctx context.Context) error {
	c.passMu.Lock()
	defer c.passMu.Unlock()
	c.spMu.Lock()
	sp := c.speaker
	c.speaker, c.withdrawn = nil, true
	c.spMu.Unlock()
	if sp == nil {
		return nil
	}
	_, err := sp.SetAdvertised(ctx, nil)
	if err != nil {
		err = fmt.Errorf("withdraw routes: %w", err)
	}
	err = errors.Join(err, sp.Stop(ctx))
	for _, svc := range c.st.ListServices("") {
		// The store may be closing: a status it cannot take any more matters to no one.
		_ = c.st.SetAdvertised(svc.Name, false, "withdrawn: lbd stopped advertising (datapath detached or lbd stopped for good)")
	}
	c.stateMu.Lock()
	clear(c.vipServices)
	c.stateMu.Unlock()
	return err
}

func (c *Controller) currentSpeaker() *bgp.Speaker {
	c.spMu.Lock()
	defer c.spMu.Unlock()
	return c.speaker
}
