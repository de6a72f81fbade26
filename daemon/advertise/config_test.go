package advertise

import (
	"github.com/lbd-dev/lbd/daemon/model/modeltest"
	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/lbd-dev/lbd/daemon/bgp"
	"sigs.k8s.io/yaml"
)

const exampleYAML = `
router_id: 198.18.0.10
local_as: 65001
listen_port: 1790
next_hop_v4: 198.18.0.10
next_hop_v6: 2001:db8::10
peers:
  - address: 198.18.0.1
    as: 65000
    password: s3cret
    hold_time: 9s
    keepalive_interval: 3s
    graceful_restart: {enabled: true, restart_time: 60s}
  - address: 2001:db8::1
    as: 65000
    port: 1179
    ebgp_multihop_ttl: 2
    passive: true
    families: [ipv6-unicast]
vip_attributes:
  - prefix: 203.0.113.0/24
    communities: ["65000:100", no-export]
    large_communities: ["65000:1:2"]
    med: 10
`

func TestConfigFromYAML(t *testing.T) {
	var c Config
	if err := yaml.UnmarshalStrict([]byte(exampleYAML), &c); err != nil {
		t.Fatalf("parse: %v", err)
	}
	bc, err := c.BGPConfig(true)
	if err != nil {
		t.Fatalf("BGPConfig: %v", err)
	}
	if bc.RouterID != netip.MustParseAddr("198.18.0.10") || bc.LocalAS != 65001 || bc.ListenPort != 1790 ||
		!bc.Restarting || bc.NextHopIPv6 != netip.MustParseAddr("2001:db8::10") || len(bc.Peers) != 2 {
		t.Fatalf("BGPConfig = %+v", bc)
	}
	p := bc.Peers[0]
	if p.Address != netip.MustParseAddr("198.18.0.1") || p.Password != "s3cret" || p.HoldTime != 9*time.Second ||
		p.KeepaliveInterval != 3*time.Second || !p.GracefulRestart.Enabled || p.GracefulRestart.RestartTime != time.Minute ||
		!slices.Equal(p.Families, []bgp.Family{bgp.IPv4Unicast, bgp.IPv6Unicast}) {
		t.Errorf("peer 0 = %+v; want the file's values, both families (IPv6 next hop set)", p)
	}
	p = bc.Peers[1]
	if p.Port != 1179 || p.EBGPMultihopTTL != 2 || !p.Passive || !slices.Equal(p.Families, []bgp.Family{bgp.IPv6Unicast}) {
		t.Errorf("peer 1 = %+v", p)
	}
	_, attrs, err := c.compile(false)
	if err != nil {
		t.Fatal(err)
	}
	r := route(netip.MustParseAddr("203.0.113.7"), attrs)
	if r.Prefix != netip.MustParsePrefix("203.0.113.7/32") || r.MED == nil || *r.MED != 10 ||
		!slices.Equal(r.Communities, []bgp.Community{65000<<16 | 100, bgp.CommunityNoExport}) ||
		!slices.Equal(r.LargeCommunities, []bgp.LargeCommunity{{GlobalAdmin: 65000, LocalData1: 1, LocalData2: 2}}) {
		t.Errorf("route = %+v", r)
	}
	if r := route(netip.MustParseAddr("198.51.100.1"), attrs); r.MED != nil || r.Communities != nil || r.Prefix.Bits() != 32 {
		t.Errorf("route outside every prefix = %+v, want no attributes", r)
	}
	if r := route(netip.MustParseAddr("2001:db8::7"), attrs); r.Prefix.Bits() != 128 {
		t.Errorf("IPv6 route = %+v, want a /128", r)
	}

	if err := yaml.UnmarshalStrict([]byte("router_id: 1.2.3.4\nlocal_as: 1\nhold_tme: 3s\n"), &c); err == nil {
		t.Error("unknown field accepted")
	}
	if err := yaml.UnmarshalStrict([]byte("peers: [{hold_time: 90}]\n"), &c); err == nil || !strings.Contains(err.Error(), "90s") {
		t.Errorf("duration as a number: %v, want an error showing the expected form", err)
	}
}

func TestConfigValidation(t *testing.T) {
	good := func() Config {
		return Config{
			RouterID: "198.18.0.10", LocalAS: 65001, NextHopV4: "198.18.0.10",
			Peers:         []Peer{{Address: "198.18.0.1", AS: 65000}, {Address: "198.18.0.2", AS: 65000}},
			VIPAttributes: []VIPAttributes{{Prefix: "203.0.113.0/24", Communities: []string{"65000:1"}}},
		}
	}
	if c := good(); c.Validate() != nil {
		t.Fatalf("good config: %v", c.Validate())
	}
	for _, tc := range []struct {
		name string
		edit func(*Config)
		want string
	}{
		{"router ID missing", func(c *Config) { c.RouterID = "" }, `bgp.router_id: "" is not a non-zero IPv4 address`},
		{"router ID IPv6", func(c *Config) { c.RouterID = "2001:db8::1" }, "bgp.router_id"},
		{"local AS 0", func(c *Config) { c.LocalAS = 0 }, "bgp.local_as: 0 is not a valid AS number"},
		{"listen port", func(c *Config) { c.ListenPort = 70000 }, "bgp.listen_port: 70000 exceeds 65535"},
		{"next hop family", func(c *Config) { c.NextHopV4 = "2001:db8::1" }, `bgp.next_hop_v4: "2001:db8::1" is not a non-zero IPv4 address`},
		{"next hop v6 mapped", func(c *Config) { c.NextHopV6 = "::ffff:198.18.0.1" }, "bgp.next_hop_v6"},
		{"bad address", func(c *Config) { c.Peers[1].Address = "198.18.0.300" }, `bgp.peers[1].address: "198.18.0.300" is not a unicast IP address`},
		{"multicast address", func(c *Config) { c.Peers[0].Address = "224.0.0.5" }, "bgp.peers[0].address"},
		{"peer AS 0", func(c *Config) { c.Peers[0].AS = 0 }, "bgp.peers[0].as: 0 is not a valid AS number"},
		{"duplicate peer", func(c *Config) { c.Peers[1].Address = "::ffff:198.18.0.1" }, "bgp.peers[1].address: 198.18.0.1 is already configured as peers[0]"},
		{"hold time too short", func(c *Config) { c.Peers[0].HoldTime = Duration(2 * time.Second) }, "bgp.peers[0].hold_time: 2s must be whole seconds"},
		{"hold time fraction", func(c *Config) { c.Peers[0].HoldTime = Duration(3500 * time.Millisecond) }, "bgp.peers[0].hold_time"},
		{"keepalive not below hold", func(c *Config) {
			c.Peers[0].HoldTime, c.Peers[0].KeepaliveInterval = Duration(9*time.Second), Duration(9*time.Second)
		}, "bgp.peers[0].keepalive_interval: 9s must be whole seconds, at least 1s and below the hold time 9s"},
		{"keepalive above default hold", func(c *Config) { c.Peers[0].KeepaliveInterval = Duration(2 * time.Minute) }, "below the hold time 1m30s"},
		{"connect retry", func(c *Config) { c.Peers[0].ConnectRetry = Duration(time.Millisecond) }, "bgp.peers[0].connect_retry"},
		{"multihop", func(c *Config) { c.Peers[0].EBGPMultihopTTL = 256 }, "bgp.peers[0].ebgp_multihop_ttl: 256 exceeds 255"},
		{"passive without listener", func(c *Config) { c.Peers[0].Passive = true }, "bgp.peers[0].passive: a passive peer needs the listener"},
		{"restart time without GR", func(c *Config) { c.Peers[0].GracefulRestart.RestartTime = Duration(time.Minute) }, "bgp.peers[0].graceful_restart.restart_time: is only meaningful"},
		{"restart time too long", func(c *Config) {
			c.Peers[0].GracefulRestart = GracefulRestart{Enabled: true, RestartTime: Duration(2 * time.Hour)}
		}, "bgp.peers[0].graceful_restart.restart_time: 2h0m0s must be whole seconds from 1s to 4095s"},
		{"unknown family", func(c *Config) { c.Peers[0].Families = []string{"ipv4-flowspec"} }, `bgp.peers[0].families[0]: "ipv4-flowspec" is not ipv4-unicast or ipv6-unicast`},
		{"family twice", func(c *Config) { c.Peers[0].Families = []string{"ipv4-unicast", "ipv4-unicast"} }, "bgp.peers[0].families[1]: ipv4-unicast is listed twice"},
		{"family without next hop", func(c *Config) { c.Peers[0].Families = []string{"ipv4-unicast", "ipv6-unicast"} }, "needs the IPv6 next hop configured"},
		{"password too long", func(c *Config) { c.Peers[0].Password = strings.Repeat("x", 81) }, "bgp.peers[0].password"},
		{"bad prefix", func(c *Config) { c.VIPAttributes[0].Prefix = "203.0.113.0" }, `bgp.vip_attributes[0].prefix: "203.0.113.0" is not a CIDR prefix`},
		{"prefix host bits", func(c *Config) { c.VIPAttributes[0].Prefix = "203.0.113.1/24" }, "has host bits set (want 203.0.113.0/24)"},
		{"bad community", func(c *Config) { c.VIPAttributes[0].Communities = []string{"65000:1", "70000:1"} }, `bgp.vip_attributes[0].communities[1]: "70000:1" is not AS:value`},
		{"bad large community", func(c *Config) { c.VIPAttributes[0].LargeCommunities = []string{"1:2"} }, `bgp.vip_attributes[0].large_communities[0]: "1:2" is not global:local1:local2`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := good()
			tc.edit(&c)
			err := c.Validate()
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Validate = %v, want an error containing %q", err, tc.want)
			}
			if _, err := New(c, openStore(t), func() bool { return true }, false, nil); err == nil {
				t.Error("New accepted the bad configuration")
			}
		})
	}

	// Several mistakes are reported together.
	c := good()
	c.LocalAS, c.Peers[0].AS = 0, 0
	err := c.Validate()
	if err == nil || !strings.Contains(err.Error(), "bgp.local_as") || !strings.Contains(err.Error(), "bgp.peers[0].as") {
		t.Errorf("Validate = %v, want both errors", err)
	}
}

func TestStatusReasons(t *testing.T) {
	p4 := netip.MustParsePrefix("203.0.113.10/32")
	p6 := netip.MustParsePrefix("2001:db8::10/128")
	up := verdict{name: "a", prefix: p4, qualifies: true}
	down := verdict{name: "b", prefix: p4, why: "no usable backend (advertise policy if-healthy)"}
	both := map[bgp.Family]int{bgp.IPv4Unicast: 2, bgp.IPv6Unicast: 1}
	for _, tc := range []struct {
		name        string
		v           verdict
		wanted      map[netip.Prefix][]string
		established map[bgp.Family]int
		setErr      error
		adv         bool
		reason      string
	}{
		{"advertised", up, map[netip.Prefix][]string{p4: {"a"}}, both, nil, true, "advertised to 2 established peers"},
		{"one peer of the family", verdict{prefix: p6, qualifies: true}, map[netip.Prefix][]string{p6: {"x"}}, both, nil, true, "advertised to 1 established peer"},
		{"no peer of the family", verdict{prefix: p6, qualifies: true}, map[netip.Prefix][]string{p6: {"x"}}, map[bgp.Family]int{bgp.IPv4Unicast: 1}, nil, false,
			"not advertised: no BGP peer is established yet (ipv6-unicast)"},
		{"withdrawn", down, map[netip.Prefix][]string{}, both, nil, false, "withdrawn: no usable backend (advertise policy if-healthy)"},
		{"kept by another service", down, map[netip.Prefix][]string{p4: {"a", "c"}}, both, nil, true,
			"advertised to 2 established peers for service a, c; this service alone would be withdrawn: no usable backend (advertise policy if-healthy)"},
		{"speaker error", up, map[netip.Prefix][]string{p4: {"a"}}, both, bgp.ErrNotStarted, false, "not advertised: the BGP speaker failed: BGP speaker not started"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			adv, reason := tc.v.status(tc.wanted, tc.established, tc.setErr)
			if adv != tc.adv || reason != tc.reason {
				t.Errorf("status = %v %q, want %v %q", adv, reason, tc.adv, tc.reason)
			}
		})
	}
}

// TestJudgeWaitsForTheDatapath: a VIP is not announced before the datapath programmed
// its service, nor when programming failed.
func TestJudgeWaitsForTheDatapath(t *testing.T) {
	c := &Controller{}
	svc := func(state lbdv1.ServiceState, usable uint32) *lbdv1.Service {
		return &lbdv1.Service{Name: "web", Vip: "203.0.113.10", Status: &lbdv1.ServiceStatus{State: state, UsableBackends: usable, Reason: "map full"}}
	}
	for _, tc := range []struct {
		svc       *lbdv1.Service
		qualifies bool
		why       string
	}{
		{svc(lbdv1.ServiceState_SERVICE_STATE_PENDING, 2), false, "waiting for the datapath to program the service"},
		{svc(lbdv1.ServiceState_SERVICE_STATE_ERROR, 2), false, "the datapath could not program the service: map full"},
		{svc(lbdv1.ServiceState_SERVICE_STATE_READY, 2), true, ""},
		{svc(lbdv1.ServiceState_SERVICE_STATE_NO_BACKENDS, 0), false, "no usable backend (advertise policy if-healthy)"},
	} {
		v := c.judge(modeltest.Of(tc.svc), true, false)
		if v.qualifies != tc.qualifies || v.why != tc.why {
			t.Errorf("%v: qualifies %v %q, want %v %q", tc.svc.Status.State, v.qualifies, v.why, tc.qualifies, tc.why)
		}
	}
}

// TestJudgeUnreachableNodes: a VIP whose backend nodes this node cannot reach is not
// announced, whatever the advertise policy; one reachable node is enough.
func TestJudgeUnreachableNodes(t *testing.T) {
	c := &Controller{}
	be := func(r lbdv1.Reachability, st lbdv1.BackendState) *lbdv1.Backend {
		return &lbdv1.Backend{Address: "198.18.0.21", Port: 80, NodeReachability: r, State: st}
	}
	unreachable := lbdv1.Reachability_REACHABILITY_UNREACHABLE
	for _, tc := range []struct {
		name      string
		policy    lbdv1.AdvertisePolicy
		backends  []*lbdv1.Backend
		qualifies bool
	}{
		{"all unreachable", lbdv1.AdvertisePolicy_ADVERTISE_POLICY_ALWAYS,
			[]*lbdv1.Backend{be(unreachable, lbdv1.BackendState_BACKEND_STATE_ACTIVE), be(unreachable, lbdv1.BackendState_BACKEND_STATE_DRAINING)}, false},
		{"a disabled one does not count", lbdv1.AdvertisePolicy_ADVERTISE_POLICY_ALWAYS,
			[]*lbdv1.Backend{be(unreachable, lbdv1.BackendState_BACKEND_STATE_ACTIVE), be(lbdv1.Reachability_REACHABILITY_REACHABLE, lbdv1.BackendState_BACKEND_STATE_DISABLED)}, false},
		{"one reachable", lbdv1.AdvertisePolicy_ADVERTISE_POLICY_ALWAYS,
			[]*lbdv1.Backend{be(unreachable, lbdv1.BackendState_BACKEND_STATE_ACTIVE), be(lbdv1.Reachability_REACHABILITY_UNSPECIFIED, lbdv1.BackendState_BACKEND_STATE_ACTIVE)}, true},
	} {
		svc := &lbdv1.Service{Name: "web", Vip: "203.0.113.10", AdvertisePolicy: tc.policy, Backends: tc.backends,
			Status: &lbdv1.ServiceStatus{State: lbdv1.ServiceState_SERVICE_STATE_READY, UsableBackends: 1}}
		v := c.judge(modeltest.Of(svc), true, false)
		if v.qualifies != tc.qualifies || (!v.qualifies && !strings.Contains(v.why, "reaches none of the service's backend nodes")) {
			t.Errorf("%s: qualifies %v %q, want %v", tc.name, v.qualifies, v.why, tc.qualifies)
		}
	}
}
