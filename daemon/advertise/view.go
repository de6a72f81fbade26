package advertise

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/lbd-dev/lbd/daemon/bgp"
	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// This file is what the API and the metrics see of the controller.

// notRunning is the reason shown for every peer while the speaker does not run.
const notRunning = "the BGP speaker is not running (lbd is starting or stopped advertising)"

var sessionStates = map[bgp.SessionState]lbdv1.BgpSessionState{
	bgp.StateIdle:        lbdv1.BgpSessionState_BGP_SESSION_STATE_IDLE,
	bgp.StateConnect:     lbdv1.BgpSessionState_BGP_SESSION_STATE_CONNECT,
	bgp.StateActive:      lbdv1.BgpSessionState_BGP_SESSION_STATE_ACTIVE,
	bgp.StateOpenSent:    lbdv1.BgpSessionState_BGP_SESSION_STATE_OPENSENT,
	bgp.StateOpenConfirm: lbdv1.BgpSessionState_BGP_SESSION_STATE_OPENCONFIRM,
	bgp.StateEstablished: lbdv1.BgpSessionState_BGP_SESSION_STATE_ESTABLISHED,
}

// Static reports whether addr is a peer of the configuration file, which the API must
// not create, change or delete.
func (c *Controller) Static(addr netip.Addr) bool {
	return c.static[addr.Unmap()]
}

// Peers returns every peer, static and from the API, with its session status, sorted by
// address. Passwords are never returned.
func (c *Controller) Peers(ctx context.Context) ([]*lbdv1.BgpPeer, error) {
	sp := c.currentSpeaker()
	if sp == nil {
		return c.idlePeers(), nil
	}
	statuses, err := sp.ListPeers(ctx)
	if errors.Is(err, bgp.ErrNotStarted) {
		return c.idlePeers(), nil
	}
	if err != nil {
		return nil, err
	}
	byAddr := make(map[netip.Addr]bgp.PeerStatus, len(statuses))
	for _, st := range statuses {
		byAddr[st.Address] = st
	}
	out := map[netip.Addr]*lbdv1.BgpPeer{}
	for _, pc := range sp.Peers() {
		p := peerToAPI(pc)
		st, ok := byAddr[pc.Address]
		if !ok {
			p.Status = &lbdv1.BgpPeerStatus{State: lbdv1.BgpSessionState_BGP_SESSION_STATE_IDLE, Reason: "being configured"}
		} else {
			p.Status = peerStatus(pc, st)
		}
		out[pc.Address] = p
	}
	c.stateMu.Lock()
	for addr, sps := range c.storePeers {
		if _, configured := out[addr]; sps.err != nil && !configured {
			p := peerToAPI(sps.cfg)
			p.Status = &lbdv1.BgpPeerStatus{
				State:  lbdv1.BgpSessionState_BGP_SESSION_STATE_IDLE,
				Reason: "not configured in the BGP speaker: " + sps.err.Error(),
			}
			out[addr] = p
		}
	}
	c.stateMu.Unlock()
	return byAddress(out), nil
}

// idlePeers lists the static and API peers while no speaker runs.
func (c *Controller) idlePeers() []*lbdv1.BgpPeer {
	out := map[netip.Addr]*lbdv1.BgpPeer{}
	for _, pc := range c.bgpCfg.Peers {
		out[pc.Address] = peerToAPI(pc)
	}
	for _, p := range c.st.BgpPeers(false) {
		if !c.Static(p.Addr) {
			out[p.Addr] = p.Spec
		}
	}
	for _, p := range out {
		p.Status = &lbdv1.BgpPeerStatus{State: lbdv1.BgpSessionState_BGP_SESSION_STATE_IDLE, Reason: notRunning}
	}
	return byAddress(out)
}

// byAddress lists peers sorted by address.
func byAddress(ps map[netip.Addr]*lbdv1.BgpPeer) []*lbdv1.BgpPeer {
	out := make([]*lbdv1.BgpPeer, 0, len(ps))
	for _, a := range slices.SortedFunc(maps.Keys(ps), netip.Addr.Compare) {
		out = append(out, ps[a])
	}
	return out
}

// peerToAPI converts a peer configuration, without its password.
func peerToAPI(pc bgp.PeerConfig) *lbdv1.BgpPeer {
	p := &lbdv1.BgpPeer{
		Address:         pc.Address.String(),
		PeerAs:          pc.AS,
		Port:            uint32(pc.Port),
		EbgpMultihopTtl: uint32(pc.EBGPMultihopTTL),
		GracefulRestart: pc.GracefulRestart.Enabled,
	}
	if p.Port == 0 {
		p.Port = bgp.DefaultPeerPort
	}
	hold := pc.HoldTime
	if hold == 0 {
		hold = bgp.DefaultHoldTime
	}
	keep := pc.KeepaliveInterval
	if keep == 0 {
		keep = (hold / 3).Truncate(time.Second)
	}
	p.HoldTime, p.KeepaliveInterval = durationpb.New(hold), durationpb.New(keep)
	if gr := pc.GracefulRestart; gr.Enabled {
		t := gr.RestartTime
		if t == 0 {
			t = bgp.DefaultRestartTime
		}
		p.GracefulRestartTime = durationpb.New(t)
	}
	return p
}

// peerStatus is the session status of a configured peer, counts summed over families.
func peerStatus(pc bgp.PeerConfig, st bgp.PeerStatus) *lbdv1.BgpPeerStatus {
	out := &lbdv1.BgpPeerStatus{State: sessionStates[st.State]}
	if out.State == lbdv1.BgpSessionState_BGP_SESSION_STATE_UNSPECIFIED {
		out.State = lbdv1.BgpSessionState_BGP_SESSION_STATE_IDLE
	}
	if !st.Since.IsZero() {
		out.SinceTime = timestamppb.New(st.Since)
	}
	for _, f := range st.Families {
		out.ReceivedRoutes += f.Received
		out.AcceptedRoutes += f.Accepted
		out.AdvertisedRoutes += f.Advertised
	}
	restart := pc.GracefulRestart.RestartTime
	if restart == 0 {
		restart = bgp.DefaultRestartTime
	}
	switch {
	case st.State == bgp.StateEstablished && st.GracefulRestart:
		out.Reason = fmt.Sprintf("graceful restart negotiated: the peer keeps this node's routes for %s while lbd restarts", restart)
	case st.State == bgp.StateEstablished && pc.GracefulRestart.Enabled:
		out.Reason = "graceful restart not negotiated (the peer did not offer it): a restart of lbd withdraws this node's routes"
	case st.State == bgp.StateEstablished:
		out.Reason = "graceful restart disabled: a restart of lbd withdraws this node's routes"
	case st.State == bgp.StateOpenSent || st.State == bgp.StateOpenConfirm:
		out.Reason = "session opening"
	case pc.Passive:
		out.Reason = "waiting for the peer to connect (passive)"
	default:
		retry := pc.ConnectRetry
		if retry == 0 {
			retry = bgp.DefaultConnectRetry
		}
		out.Reason = fmt.Sprintf("not established: connecting to %s every %s", netip.AddrPortFrom(pc.Address, pc.Port), retry)
	}
	return out
}

// Routes returns the routes the speaker advertises, sorted by prefix, each with the
// services that want it.
func (c *Controller) Routes(ctx context.Context) ([]*lbdv1.BgpRoute, error) {
	sp := c.currentSpeaker()
	if sp == nil {
		return nil, nil
	}
	routes, err := sp.ListRoutes(ctx)
	if errors.Is(err, bgp.ErrNotStarted) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	c.stateMu.Lock()
	defer c.stateMu.Unlock()
	out := make([]*lbdv1.BgpRoute, 0, len(routes))
	for _, r := range routes {
		br := &lbdv1.BgpRoute{
			Prefix:      r.Prefix.String(),
			ServiceName: strings.Join(c.vipServices[r.Prefix], ","),
		}
		// An unspecified next hop means each session's local address ("self").
		if r.NextHop.IsValid() && !r.NextHop.IsUnspecified() {
			br.NextHop = r.NextHop.String()
		}
		for _, cm := range r.Communities {
			br.Communities = append(br.Communities, communityString(cm))
		}
		for _, lc := range r.LargeCommunities {
			br.LargeCommunities = append(br.LargeCommunities, lc.String())
		}
		if r.MED != nil {
			br.Med = *r.MED
		}
		out = append(out, br)
	}
	return out, nil
}

// communityString writes well-known communities by name, as they are configured.
func communityString(cm bgp.Community) string {
	switch cm {
	case bgp.CommunityNoExport:
		return "no-export"
	case bgp.CommunityNoAdvertise:
		return "no-advertise"
	}
	return cm.String()
}

// Metrics is a snapshot for the Prometheus collector.
type Metrics struct {
	// Running is false while no speaker runs; the other fields are then empty.
	Running bool
	Peers   []PeerMetrics
	// AdvertisedRoutes counts the VIPs handed to the speaker.
	AdvertisedRoutes int
	// Announcements and Withdrawals count route changes sent since the speaker started.
	Announcements, Withdrawals uint64
}

// PeerMetrics is one session's state.
type PeerMetrics struct {
	Address     string
	AS          uint32
	State       string
	Established bool
	// AdvertisedRoutes counts the prefixes sent to the peer, over all families.
	AdvertisedRoutes uint64
}

// Metrics returns the session states and route counts.
func (c *Controller) Metrics(ctx context.Context) (Metrics, error) {
	sp := c.currentSpeaker()
	if sp == nil {
		return Metrics{}, nil
	}
	statuses, err := sp.ListPeers(ctx)
	if errors.Is(err, bgp.ErrNotStarted) {
		return Metrics{}, nil
	}
	if err != nil {
		return Metrics{}, err
	}
	m := Metrics{Running: true}
	for _, st := range statuses {
		pm := PeerMetrics{Address: st.Address.String(), AS: st.AS, State: string(st.State), Established: st.State == bgp.StateEstablished}
		for _, f := range st.Families {
			pm.AdvertisedRoutes += f.Advertised
		}
		m.Peers = append(m.Peers, pm)
	}
	s := sp.Stats()
	m.Announcements, m.Withdrawals = s.Announcements, s.Withdrawals
	c.stateMu.Lock()
	m.AdvertisedRoutes = len(c.vipServices)
	c.stateMu.Unlock()
	return m, nil
}
