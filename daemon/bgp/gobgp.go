package bgp

// This file is the only one that knows GoBGP: a GoBGP upgrade changes it alone.

import (
	"context"
	"fmt"
	"net/netip"
	"sort"
	"time"

	"github.com/hashicorp/go-hclog"
	api "github.com/osrg/gobgp/v3/api"
	"github.com/osrg/gobgp/v3/pkg/apiutil"
	gobgplog "github.com/osrg/gobgp/v3/pkg/log"
	"github.com/osrg/gobgp/v3/pkg/packet/bgp"
	"github.com/osrg/gobgp/v3/pkg/server"
)

// rejectLearnedPolicy keeps routes learned from peers out of the RIB: an LB
// node originates VIPs and must never become a transit between its peers.
const rejectLearnedPolicy = "lbd-reject-learned"

// gobgpServer wraps one embedded GoBGP instance.
type gobgpServer struct {
	s   *server.BgpServer
	log hclog.Logger
	// life ends when the server stops; peer watches end with it.
	life   context.Context
	cancel context.CancelFunc
}

func startGoBGP(ctx context.Context, cfg Config, logger hclog.Logger) (*gobgpServer, error) {
	s := server.NewBgpServer(server.LoggerOption(hclogAdapter{logger.Named("gobgp")}))
	go s.Serve()
	// GoBGP listens on 179 unless told -1; the listener is off unless configured.
	port := int32(-1)
	if cfg.ListenPort != 0 {
		port = int32(cfg.ListenPort)
	}
	var listen []string
	for _, a := range cfg.ListenAddresses {
		listen = append(listen, a.Unmap().String())
	}
	life, cancel := context.WithCancel(context.Background())
	g := &gobgpServer{s: s, log: logger, life: life, cancel: cancel}
	err := s.StartBgp(ctx, &api.StartBgpRequest{Global: &api.Global{
		Asn:             cfg.LocalAS,
		RouterId:        cfg.RouterID.String(),
		ListenPort:      port,
		ListenAddresses: listen,
	}})
	if err == nil {
		err = g.installPolicy(ctx)
	}
	if err != nil {
		cancel()
		s.Stop()
		return nil, err
	}
	return g, nil
}

func (g *gobgpServer) installPolicy(ctx context.Context) error {
	reject := func(name string, t api.Conditions_RouteType) *api.Statement {
		return &api.Statement{
			Name:       name,
			Conditions: &api.Conditions{RouteType: t},
			Actions:    &api.Actions{RouteAction: api.RouteAction_REJECT},
		}
	}
	err := g.s.AddPolicy(ctx, &api.AddPolicyRequest{Policy: &api.Policy{
		Name: rejectLearnedPolicy,
		Statements: []*api.Statement{
			reject(rejectLearnedPolicy+"-ebgp", api.Conditions_ROUTE_TYPE_EXTERNAL),
			reject(rejectLearnedPolicy+"-ibgp", api.Conditions_ROUTE_TYPE_INTERNAL),
		},
	}})
	if err != nil {
		return fmt.Errorf("add import policy: %w", err)
	}
	err = g.s.AddPolicyAssignment(ctx, &api.AddPolicyAssignmentRequest{Assignment: &api.PolicyAssignment{
		Name:          "global",
		Direction:     api.PolicyDirection_IMPORT,
		Policies:      []*api.Policy{{Name: rejectLearnedPolicy}},
		DefaultAction: api.RouteAction_ACCEPT,
	}})
	if err != nil {
		return fmt.Errorf("assign import policy: %w", err)
	}
	return nil
}

// stop closes all sessions (GoBGP sends Cease/Peer De-configured, mapped to
// Hard Reset where RFC 8538 was negotiated) and waits for them to end.
func (g *gobgpServer) stop(ctx context.Context) error {
	g.cancel()
	done := make(chan struct{})
	go func() {
		g.s.Stop()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (g *gobgpServer) addPeer(ctx context.Context, p PeerConfig, localAS uint32, restarting bool) error {
	return g.s.AddPeer(ctx, &api.AddPeerRequest{Peer: peerToAPI(p, localAS, restarting)})
}

func (g *gobgpServer) deletePeer(ctx context.Context, addr netip.Addr) error {
	return g.s.DeletePeer(ctx, &api.DeletePeerRequest{Address: addr.String()})
}

func apiFamily(f Family) *api.Family {
	if f == IPv6Unicast {
		return &api.Family{Afi: api.Family_AFI_IP6, Safi: api.Family_SAFI_UNICAST}
	}
	return &api.Family{Afi: api.Family_AFI_IP, Safi: api.Family_SAFI_UNICAST}
}

func familyFromAPI(f *api.Family) (Family, bool) {
	if f.GetSafi() != api.Family_SAFI_UNICAST {
		return "", false
	}
	switch f.GetAfi() {
	case api.Family_AFI_IP:
		return IPv4Unicast, true
	case api.Family_AFI_IP6:
		return IPv6Unicast, true
	}
	return "", false
}

func peerToAPI(p PeerConfig, localAS uint32, restarting bool) *api.Peer {
	gr := p.GracefulRestart
	afs := make([]*api.AfiSafi, 0, len(p.Families))
	for _, f := range p.Families {
		afs = append(afs, &api.AfiSafi{
			Config: &api.AfiSafiConfig{Family: apiFamily(f), Enabled: true},
			// Without per-family tuples the capability would promise nothing.
			MpGracefulRestart: &api.MpGracefulRestart{Config: &api.MpGracefulRestartConfig{Enabled: gr.Enabled}},
		})
	}
	peer := &api.Peer{
		Conf: &api.PeerConf{
			NeighborAddress: p.Address.String(),
			PeerAsn:         p.AS,
			LocalAsn:        localAS,
			AuthPassword:    p.Password,
		},
		Timers: &api.Timers{Config: &api.TimersConfig{
			HoldTime:          uint64(p.HoldTime / time.Second),
			KeepaliveInterval: uint64(p.KeepaliveInterval / time.Second),
			ConnectRetry:      uint64(p.ConnectRetry / time.Second),
		}},
		Transport: &api.Transport{
			RemotePort:  uint32(p.Port),
			PassiveMode: p.Passive,
		},
		AfiSafis: afs,
	}
	if p.LocalAddress.IsValid() {
		peer.Transport.LocalAddress = p.LocalAddress.String()
	}
	if p.EBGPMultihopTTL > 0 {
		peer.EbgpMultihop = &api.EbgpMultihop{Enabled: true, MultihopTtl: uint32(p.EBGPMultihopTTL)}
	}
	if gr.Enabled {
		secs := uint32(gr.RestartTime / time.Second)
		peer.GracefulRestart = &api.GracefulRestart{
			Enabled:     true,
			RestartTime: secs,
			// After a restart, wait for the peers' End-of-RIB at most as long
			// as they keep our stale routes.
			DeferralTime:    secs,
			LocalRestarting: restarting,
		}
	}
	return peer
}

var sessionStates = map[api.PeerState_SessionState]SessionState{
	api.PeerState_IDLE:        StateIdle,
	api.PeerState_CONNECT:     StateConnect,
	api.PeerState_ACTIVE:      StateActive,
	api.PeerState_OPENSENT:    StateOpenSent,
	api.PeerState_OPENCONFIRM: StateOpenConfirm,
	api.PeerState_ESTABLISHED: StateEstablished,
}

func sessionState(s api.PeerState_SessionState) SessionState {
	if st, ok := sessionStates[s]; ok {
		return st
	}
	return StateUnknown
}

func (g *gobgpServer) listPeers(ctx context.Context) ([]PeerStatus, error) {
	var out []PeerStatus
	var convErr error
	err := g.s.ListPeer(ctx, &api.ListPeerRequest{EnableAdvertised: true}, func(p *api.Peer) {
		st, err := peerStatus(p)
		if err != nil {
			convErr = err
			return
		}
		out = append(out, st)
	})
	if err != nil {
		return nil, err
	}
	return out, convErr
}

// peerStatus converts GoBGP's answer about a peer. GoBGP's API gives addresses as
// strings: parsing them here is a boundary, like the API's own requests.
func peerStatus(p *api.Peer) (PeerStatus, error) {
	addr, err := netip.ParseAddr(p.GetConf().GetNeighborAddress())
	if err != nil {
		return PeerStatus{}, fmt.Errorf("parse peer address: %w", err)
	}
	st := PeerStatus{
		Address: addr.Unmap(),
		AS:      p.GetConf().GetPeerAsn(),
		State:   sessionState(p.GetState().GetSessionState()),
		Flops:   p.GetState().GetFlops(),
	}
	if id, err := netip.ParseAddr(p.GetState().GetRouterId()); err == nil && !id.IsUnspecified() {
		st.RouterID = id
	}
	since := p.GetTimers().GetState().GetDowntime()
	if st.State == StateEstablished {
		since = p.GetTimers().GetState().GetUptime()
	}
	if since != nil {
		st.Since = since.AsTime()
	}
	if p.GetGracefulRestart().GetEnabled() && st.State == StateEstablished {
		remote, err := apiutil.UnmarshalCapabilities(p.GetState().GetRemoteCap())
		if err != nil {
			return PeerStatus{}, fmt.Errorf("parse capabilities of %s: %w", addr, err)
		}
		for _, c := range remote {
			if gr, ok := c.(*bgp.CapGracefulRestart); ok {
				st.GracefulRestart = true
				st.PeerRestartTime = time.Duration(gr.Time) * time.Second
			}
		}
	}
	for _, af := range p.GetAfiSafis() {
		f, ok := familyFromAPI(af.GetConfig().GetFamily())
		if !ok {
			continue
		}
		adv := af.GetState().GetAdvertised()
		// GoBGP 3.37 counts the End-of-RIB marker it sends per family on a graceful-
		// restart session as an advertised path; operators expect prefixes.
		if p.GetGracefulRestart().GetEnabled() && adv > 0 {
			adv--
		}
		st.Families = append(st.Families, FamilyStatus{
			Family:     f,
			Received:   af.GetState().GetReceived(),
			Accepted:   af.GetState().GetAccepted(),
			Advertised: adv,
		})
	}
	sort.Slice(st.Families, func(i, j int) bool { return st.Families[i].Family < st.Families[j].Family })
	return st, nil
}

// watchPeers calls fn for every session state change until ctx ends.
func (g *gobgpServer) watchPeers(ctx context.Context, fn func(PeerEvent)) error {
	return g.s.WatchEvent(ctx, &api.WatchEventRequest{Peer: &api.WatchEventRequest_Peer{}},
		func(r *api.WatchEventResponse) {
			ev := r.GetPeer()
			if ev == nil || ev.GetType() != api.WatchEventResponse_PeerEvent_STATE {
				return
			}
			// A boundary: GoBGP's events name peers by address strings.
			addr, err := netip.ParseAddr(ev.GetPeer().GetState().GetNeighborAddress())
			if err != nil {
				g.log.Warn("peer event without address", "op", "watch-peers", "error", err)
				return
			}
			fn(PeerEvent{
				Address: addr.Unmap(),
				AS:      ev.GetPeer().GetState().GetPeerAsn(),
				State:   sessionState(ev.GetPeer().GetState().GetSessionState()),
				Time:    time.Now(),
			})
		})
}

// apiPath builds the GoBGP path for r with the given next hop.
func apiPath(r Route, nextHop netip.Addr, withdraw bool) (*api.Path, error) {
	var nlri bgp.AddrPrefixInterface
	attrs := []bgp.PathAttributeInterface{bgp.NewPathAttributeOrigin(bgp.BGP_ORIGIN_ATTR_TYPE_IGP)}
	if r.Prefix.Addr().Is4() {
		nlri = bgp.NewIPAddrPrefix(uint8(r.Prefix.Bits()), r.Prefix.Addr().String())
		attrs = append(attrs, bgp.NewPathAttributeNextHop(nextHop.String()))
	} else {
		nlri = bgp.NewIPv6AddrPrefix(uint8(r.Prefix.Bits()), r.Prefix.Addr().String())
		attrs = append(attrs, bgp.NewPathAttributeMpReachNLRI(nextHop.String(), []bgp.AddrPrefixInterface{nlri}))
	}
	if r.MED != nil {
		attrs = append(attrs, bgp.NewPathAttributeMultiExitDisc(*r.MED))
	}
	if len(r.Communities) > 0 {
		cs := make([]uint32, len(r.Communities))
		for i, c := range r.Communities {
			cs[i] = uint32(c)
		}
		attrs = append(attrs, bgp.NewPathAttributeCommunities(cs))
	}
	if len(r.LargeCommunities) > 0 {
		ls := make([]*bgp.LargeCommunity, len(r.LargeCommunities))
		for i, c := range r.LargeCommunities {
			ls[i] = bgp.NewLargeCommunity(c.GlobalAdmin, c.LocalData1, c.LocalData2)
		}
		attrs = append(attrs, bgp.NewPathAttributeLargeCommunities(ls))
	}
	return apiutil.NewPath(nlri, withdraw, attrs, time.Now())
}

func (g *gobgpServer) announce(ctx context.Context, r Route, nextHop netip.Addr) error {
	path, err := apiPath(r, nextHop, false)
	if err != nil {
		return fmt.Errorf("build path: %w", err)
	}
	_, err = g.s.AddPath(ctx, &api.AddPathRequest{TableType: api.TableType_GLOBAL, Path: path})
	return err
}

func (g *gobgpServer) withdraw(ctx context.Context, r Route, nextHop netip.Addr) error {
	path, err := apiPath(r, nextHop, true)
	if err != nil {
		return fmt.Errorf("build path: %w", err)
	}
	return g.s.DeletePath(ctx, &api.DeletePathRequest{TableType: api.TableType_GLOBAL, Path: path})
}

func (g *gobgpServer) listRoutes(ctx context.Context) ([]AdvertisedRoute, error) {
	var out []AdvertisedRoute
	for _, f := range []Family{IPv4Unicast, IPv6Unicast} {
		var convErr error
		err := g.s.ListPath(ctx, &api.ListPathRequest{TableType: api.TableType_GLOBAL, Family: apiFamily(f)},
			func(d *api.Destination) {
				for _, p := range d.GetPaths() {
					r, err := routeFromPath(p)
					if err != nil {
						convErr = err
						continue
					}
					out = append(out, r)
				}
			})
		if err != nil {
			return nil, fmt.Errorf("list %s paths: %w", f, err)
		}
		if convErr != nil {
			return nil, convErr
		}
	}
	return out, nil
}

// routeFromPath converts a GoBGP path back to a route; tests use it to read a
// peer's RIB as well.
func routeFromPath(p *api.Path) (AdvertisedRoute, error) {
	nlri, err := apiutil.GetNativeNlri(p)
	if err != nil {
		return AdvertisedRoute{}, fmt.Errorf("decode NLRI: %w", err)
	}
	// A boundary: GoBGP's NLRI types print their prefix; they hold no netip value.
	prefix, err := netip.ParsePrefix(nlri.String())
	if err != nil {
		return AdvertisedRoute{}, fmt.Errorf("parse prefix %q: %w", nlri.String(), err)
	}
	attrs, err := apiutil.GetNativePathAttributes(p)
	if err != nil {
		return AdvertisedRoute{}, fmt.Errorf("decode attributes of %s: %w", prefix, err)
	}
	r := AdvertisedRoute{Route: Route{Prefix: prefix}}
	if age := p.GetAge(); age != nil {
		r.Since = age.AsTime()
	}
	for _, a := range attrs {
		switch a := a.(type) {
		case *bgp.PathAttributeNextHop:
			r.NextHop, _ = netip.AddrFromSlice(a.Value)
		case *bgp.PathAttributeMpReachNLRI:
			r.NextHop, _ = netip.AddrFromSlice(a.Nexthop)
		case *bgp.PathAttributeMultiExitDisc:
			med := a.Value
			r.MED = &med
		case *bgp.PathAttributeCommunities:
			for _, c := range a.Value {
				r.Communities = append(r.Communities, Community(c))
			}
		case *bgp.PathAttributeLargeCommunities:
			for _, c := range a.Values {
				r.LargeCommunities = append(r.LargeCommunities, LargeCommunity{c.ASN, c.LocalData1, c.LocalData2})
			}
		}
	}
	r.NextHop = r.NextHop.Unmap()
	r.Route = r.Route.normalized()
	return r, nil
}

// hclogAdapter sends GoBGP's log lines to hclog as key/value pairs.
type hclogAdapter struct{ l hclog.Logger }

func (a hclogAdapter) args(fields gobgplog.Fields) []any {
	keys := make([]string, 0, len(fields))
	for k := range fields {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	out := make([]any, 0, 2*len(keys))
	for _, k := range keys {
		out = append(out, k, fields[k])
	}
	return out
}

// Panic and Fatal mark GoBGP internal bugs; GoBGP expects them not to return.
// A library must not exit the process, so both panic.
func (a hclogAdapter) Panic(msg string, fields gobgplog.Fields) {
	a.l.Error(msg, a.args(fields)...)
	panic("gobgp: " + msg)
}

func (a hclogAdapter) Fatal(msg string, fields gobgplog.Fields) {
	a.l.Error(msg, a.args(fields)...)
	panic("gobgp: " + msg)
}

func (a hclogAdapter) Error(msg string, fields gobgplog.Fields) { a.l.Error(msg, a.args(fields)...) }
func (a hclogAdapter) Warn(msg string, fields gobgplog.Fields)  { a.l.Warn(msg, a.args(fields)...) }
func (a hclogAdapter) Info(msg string, fields gobgplog.Fields)  { a.l.Info(msg, a.args(fields)...) }
func (a hclogAdapter) Debug(msg string, fields gobgplog.Fields) { a.l.Debug(msg, a.args(fields)...) }

func (a hclogAdapter) SetLevel(level gobgplog.LogLevel) {
	switch level {
	case gobgplog.PanicLevel, gobgplog.FatalLevel, gobgplog.ErrorLevel:
		a.l.SetLevel(hclog.Error)
	case gobgplog.WarnLevel:
		a.l.SetLevel(hclog.Warn)
	case gobgplog.InfoLevel:
		a.l.SetLevel(hclog.Info)
	case gobgplog.DebugLevel:
		a.l.SetLevel(hclog.Debug)
	default:
		a.l.SetLevel(hclog.Trace)
	}
}

// GetLevel lets GoBGP skip building debug fields that hclog would drop.
func (a hclogAdapter) GetLevel() gobgplog.LogLevel {
	switch a.l.GetLevel() {
	case hclog.Trace:
		return gobgplog.TraceLevel
	case hclog.Debug:
		return gobgplog.DebugLevel
	case hclog.Warn:
		return gobgplog.WarnLevel
	case hclog.Error, hclog.Off:
		return gobgplog.ErrorLevel
	default:
		return gobgplog.InfoLevel
	}
}
