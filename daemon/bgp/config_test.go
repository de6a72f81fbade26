package bgp

import (
	"errors"
	"net/netip"
	"strings"
	"testing"
	"time"
)

func TestConfigValidation(t *testing.T) {
	t.Parallel()
	peer := func(mod func(*PeerConfig)) Config {
		p := PeerConfig{Address: netip.MustParseAddr("198.18.0.1"), AS: 65000}
		mod(&p)
		return Config{RouterID: netip.MustParseAddr("198.18.0.10"), LocalAS: 65001, Peers: []PeerConfig{p}}
	}
	tests := []struct {
		name    string
		cfg     Config
		wantErr error
		wantMsg string
	}{
		{"valid", peer(func(*PeerConfig) {}), nil, ""},
		{"valid IPv6 peer with both families", func() Config {
			c := peer(func(p *PeerConfig) {
				p.Address = netip.MustParseAddr("2001:db8::1")
				p.Families = []Family{IPv6Unicast, IPv4Unicast}
			})
			c.NextHopIPv4 = netip.MustParseAddr("198.18.0.10")
			return c
		}(), nil, ""},
		{"valid full peer", peer(func(p *PeerConfig) {
			p.Port = 1179
			p.Password = "secret"
			p.HoldTime = 9 * time.Second
			p.KeepaliveInterval = 3 * time.Second
			p.EBGPMultihopTTL = 4
			p.GracefulRestart = GracefulRestartConfig{Enabled: true, RestartTime: 60 * time.Second}
		}), nil, ""},
		{"no router ID", Config{LocalAS: 1}, ErrInvalidConfig, "router ID"},
		{"IPv6 router ID", Config{RouterID: netip.MustParseAddr("2001:db8::1"), LocalAS: 1}, ErrInvalidConfig, "router ID"},
		{"local AS 0", Config{RouterID: netip.MustParseAddr("198.18.0.10")}, ErrInvalidConfig, "local AS"},
		{"listen addresses without port", func() Config {
			c := peer(func(*PeerConfig) {})
			c.ListenAddresses = []netip.Addr{netip.MustParseAddr("198.18.0.10")}
			return c
		}(), ErrInvalidConfig, "listen port"},
		{"IPv6 next hop for IPv4", func() Config {
			c := peer(func(*PeerConfig) {})
			c.NextHopIPv4 = netip.MustParseAddr("2001:db8::1")
			return c
		}(), ErrInvalidConfig, "IPv4 next hop"},
		{"missing peer address", peer(func(p *PeerConfig) { p.Address = netip.Addr{} }), ErrInvalidConfig, "peer address"},
		{"unspecified peer address", peer(func(p *PeerConfig) { p.Address = netip.IPv4Unspecified() }), ErrInvalidConfig, "unicast"},
		{"multicast peer address", peer(func(p *PeerConfig) { p.Address = netip.MustParseAddr("ff02::5") }), ErrInvalidConfig, "unicast"},
		{"peer AS 0", peer(func(p *PeerConfig) { p.AS = 0 }), ErrInvalidConfig, "AS must not be 0"},
		{"keepalive equal to hold", peer(func(p *PeerConfig) {
			p.HoldTime = 9 * time.Second
			p.KeepaliveInterval = 9 * time.Second
		}), ErrInvalidConfig, "keepalive interval"},
		{"keepalive above default hold", peer(func(p *PeerConfig) { p.KeepaliveInterval = 2 * time.Minute }), ErrInvalidConfig, "shorter than hold time"},
		{"hold below 3 s", peer(func(p *PeerConfig) { p.HoldTime = 2 * time.Second }), ErrInvalidConfig, "hold time"},
		{"fractional hold", peer(func(p *PeerConfig) { p.HoldTime = 3500 * time.Millisecond }), ErrInvalidConfig, "whole seconds"},
		{"restart time without graceful restart", peer(func(p *PeerConfig) {
			p.GracefulRestart.RestartTime = time.Minute
		}), ErrInvalidConfig, "graceful restart disabled"},
		{"restart time too long", peer(func(p *PeerConfig) {
			p.GracefulRestart = GracefulRestartConfig{Enabled: true, RestartTime: time.Hour + 10*time.Minute}
		}), ErrInvalidConfig, "restart time"},
		{"unknown family", peer(func(p *PeerConfig) { p.Families = []Family{"l2vpn-evpn"} }), ErrInvalidConfig, "unknown family"},
		{"family twice", peer(func(p *PeerConfig) { p.Families = []Family{IPv4Unicast, IPv4Unicast} }), ErrInvalidConfig, "twice"},
		{"IPv6 over IPv4 without IPv6 next hop", peer(func(p *PeerConfig) {
			p.Families = []Family{IPv4Unicast, IPv6Unicast}
		}), ErrInvalidConfig, "IPv6 next hop"},
		{"local address of other family", peer(func(p *PeerConfig) {
			p.LocalAddress = netip.MustParseAddr("2001:db8::2")
		}), ErrInvalidConfig, "local address"},
		{"passive without listener", peer(func(p *PeerConfig) { p.Passive = true }), ErrInvalidConfig, "listener"},
		{"duplicate peer", func() Config {
			c := peer(func(*PeerConfig) {})
			dup := c.Peers[0]
			dup.Address = netip.AddrFrom16(dup.Address.As16())
			c.Peers = append(c.Peers, dup)
			return c
		}(), ErrPeerExists, "198.18.0.1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := New(tt.cfg, nil)
			if tt.wantErr == nil {
				if err != nil {
					t.Fatalf("New: %v", err)
				}
				return
			}
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("New = %v, want %v", err, tt.wantErr)
			}
			if !strings.Contains(err.Error(), tt.wantMsg) {
				t.Errorf("error %q does not mention %q", err, tt.wantMsg)
			}
		})
	}
}

func TestPeerDefaults(t *testing.T) {
	t.Parallel()
	p := PeerConfig{Address: netip.MustParseAddr("2001:db8::1"), AS: 1, HoldTime: 30 * time.Second,
		GracefulRestart: GracefulRestartConfig{Enabled: true}}.withDefaults()
	if p.Port != 179 || p.KeepaliveInterval != 10*time.Second || p.ConnectRetry != DefaultConnectRetry ||
		p.GracefulRestart.RestartTime != DefaultRestartTime || len(p.Families) != 1 || p.Families[0] != IPv6Unicast {
		t.Errorf("defaults = %+v", p)
	}
}

func TestParseCommunity(t *testing.T) {
	t.Parallel()
	good := map[string]Community{
		"65000:100":    65000<<16 | 100,
		"0:0":          0,
		"65535:65535":  0xFFFFFFFF,
		"no-export":    CommunityNoExport,
		"no-advertise": CommunityNoAdvertise,
	}
	for in, want := range good {
		got, err := ParseCommunity(in)
		if err != nil || got != want {
			t.Errorf("ParseCommunity(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	if got := Community(65000<<16 | 100).String(); got != "65000:100" {
		t.Errorf("String = %q", got)
	}
	for _, in := range []string{"", "65000", "65536:1", "1:65536", "a:b", "1:2:3"} {
		if _, err := ParseCommunity(in); err == nil {
			t.Errorf("ParseCommunity(%q) succeeded, want error", in)
		}
	}
}

func TestParseLargeCommunity(t *testing.T) {
	t.Parallel()
	got, err := ParseLargeCommunity("4200000000:1:4294967295")
	if want := (LargeCommunity{4200000000, 1, 4294967295}); err != nil || got != want {
		t.Errorf("ParseLargeCommunity = %v, %v; want %v", got, err, want)
	}
	if s := got.String(); s != "4200000000:1:4294967295" {
		t.Errorf("String = %q", s)
	}
	for _, in := range []string{"", "1:2", "1:2:3:4", "1:2:4294967296", "x:1:2"} {
		if _, err := ParseLargeCommunity(in); err == nil {
			t.Errorf("ParseLargeCommunity(%q) succeeded, want error", in)
		}
	}
}

func TestRouteNormalization(t *testing.T) {
	t.Parallel()
	a := Route{Prefix: vipA, Communities: []Community{3, 1, 3}, LargeCommunities: []LargeCommunity{{2, 0, 0}, {1, 5, 5}}, MED: med(7)}
	b := Route{Prefix: vipA, Communities: []Community{1, 3}, LargeCommunities: []LargeCommunity{{1, 5, 5}, {2, 0, 0}, {1, 5, 5}}, MED: med(7)}
	if !sameAttributes(a.normalized(), b.normalized()) {
		t.Errorf("same attributes in another order compare different")
	}
	c := b
	c.MED = nil
	if sameAttributes(b.normalized(), c.normalized()) {
		t.Errorf("MED 7 and no MED compare equal")
	}
	c.MED = med(0)
	if sameAttributes(b.normalized(), c.normalized()) {
		t.Errorf("MED 7 and MED 0 compare equal")
	}
}

func TestValidateRoutes(t *testing.T) {
	t.Parallel()
	bad := map[string][]Route{
		"zero prefix": {{}},
		"host bits":   {{Prefix: netip.MustParsePrefix("203.0.113.1/24")}},
		"duplicate":   {{Prefix: vipA}, {Prefix: vipA}},
		"IPv4-mapped": {{Prefix: netip.MustParsePrefix("::ffff:203.0.113.1/128")}},
	}
	for name, routes := range bad {
		if err := validateRoutes(routes); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("%s: validateRoutes = %v, want ErrInvalidConfig", name, err)
		}
	}
	if err := validateRoutes([]Route{{Prefix: vipA}, {Prefix: vip6}, {Prefix: netip.MustParsePrefix("203.0.113.0/24")}}); err != nil {
		t.Errorf("validateRoutes(good) = %v", err)
	}
}
