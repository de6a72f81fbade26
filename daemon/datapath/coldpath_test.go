//go:build linux

package datapath

import (
	"context"
	"fmt"
	"github.com/lbd-dev/lbd/daemon/model/modeltest"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/lbd-dev/lbd/internal/pktgen"
	"github.com/lbd-dev/lbd/internal/testnet"
	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
)

// TestUnresolvedNextHopPassesThroughKernel: while the backend node's neighbour entry
// cannot resolve (it answers no ARP), the LB node hands the encapsulated packets to the
// kernel, which holds them until the address resolves and then sends them: every
// datagram reaches the backend node once it answers, none is lost. The kernel takes
// them only because lbd sets accept_local on the uplink (their outer source is the
// node's own address) and keeps reverse-path filtering loose, even when the host's
// "all" setting is strict.
func TestUnresolvedNextHopPassesThroughKernel(t *testing.T) {
	for _, v6 := range []bool{false, true} {
		t.Run(map[bool]string{false: "IPv4 underlay", true: "IPv6 underlay"}[v6], func(t *testing.T) { coldPath(t, v6) })
	}
}

// coldPath is TestUnresolvedNextHopPassesThroughKernel over an IPv4 or IPv6 underlay.
func coldPath(t *testing.T, v6 bool) {
	sfx := testnet.Suffix(t)
	client, lb, be := testnet.NewNS(t, "cpc-"+sfx), testnet.NewNS(t, "cpl-"+sfx), testnet.NewNS(t, "cpb-"+sfx)
	cIf, up, lbBe, beIf := "cpc"+sfx, "cpu"+sfx, "cpl"+sfx, "cpb"+sfx
	testnet.Veth(t, testnet.VethEnd{NS: client, Name: cIf}, testnet.VethEnd{NS: lb, Name: up})
	testnet.Veth(t, testnet.VethEnd{NS: lb, Name: lbBe}, testnet.VethEnd{NS: be, Name: beIf})
	client.AddAddr(t, cIf, netip.MustParsePrefix("198.18.20.2/24"))
	lb.AddAddr(t, up, netip.MustParsePrefix("198.18.20.1/24"))
	lb.AddAddr(t, lbBe, netip.MustParsePrefix("198.18.21.1/24"), netip.MustParsePrefix("2001:db8:21::1/64"))
	be.AddAddr(t, beIf, netip.MustParsePrefix("198.18.21.2/24"), netip.MustParsePrefix("2001:db8:21::2/64"))
	client.IP(t, "route add 203.0.113.10/32 via 198.18.20.1")
	// A host whose reverse-path filtering is strict.
	lb.Sysctl(t, "net.ipv4.conf.all.rp_filter=1", "net.ipv6.conf.all.forwarding=1")
	for _, ns := range []*testnet.NS{lb, be} {
		ns.Sysctl(t, "net.ipv6.conf.all.accept_dad=0", "net.ipv6.conf.default.accept_dad=0")
	}
	// The backend node answers no address resolution (ARP, or neighbour solicitations)
	// until told to; its veth end runs an XDP program so that the LB node can redirect
	// to it once it does.
	nodeAddr, block, unblock := "198.18.21.2", []string{"ip", "link", "set", "dev", beIf, "arp", "off"}, []string{"ip", "link", "set", "dev", beIf, "arp", "on"}
	if v6 {
		testnet.Require(t, "nft")
		nodeAddr = "2001:db8:21::2"
		block = []string{"nft", "add table inet cp; add chain inet cp in { type filter hook input priority 0; }; add rule inet cp in icmpv6 type nd-neighbor-solicit drop"}
		unblock = []string{"nft", "delete table inet cp"}
	}
	be.Exec(t, block...)
	be.PassXDP(t, beIf)
	capture := be.Capture(t, beIf)

	n := &node{ns: lb, uplink: up, bpffs: testnet.MountDir(t)}
	m := n.open(t, n.config(1<<16))
	b := backend(1, "198.18.21.2", 53, active)
	b.NodeAddress = nodeAddr
	svc := service(1, "dns", "203.0.113.10", 53, 251, b)
	svc.Protocol = lbdv1.Protocol_PROTOCOL_UDP
	if _, err := m.Sync(context.Background(), modeltest.All(svc)); err != nil {
		t.Fatal(err)
	}

	const datagrams = 5
	client.Do(t, func() {
		c, err := net.Dial("udp", "203.0.113.10:53")
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		for i := range datagrams {
			if _, err := fmt.Fprintf(c, "datagram %d", i); err != nil {
				t.Fatal(err)
			}
		}
	})
	passed := func() uint64 {
		st, err := m.GetStats(context.Background(), nil)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range st.GetReasons() {
			if r.GetName() == "lb_pass_no_neighbour" {
				return r.GetPackets()
			}
		}
		return 0
	}
	deadline := time.Now().Add(5 * time.Second)
	for passed() < datagrams && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if got := passed(); got != datagrams {
		t.Fatalf("%d of %d datagrams handed to the kernel, want all: the next hop was resolved", got, datagrams)
	}
	time.Sleep(300 * time.Millisecond)
	be.Exec(t, unblock...)

	var got map[string]bool
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		got = map[string]bool{}
		for _, f := range capture.Frames() {
			if f.Outgoing {
				continue
			}
			if d := pktgen.Parse(f.Data); d.Geneve != nil && d.Inner.UDP != nil {
				got[string(d.Inner.UDP.Payload)] = true
			}
		}
		if len(got) == datagrams {
			break
		}
	}
	if len(got) != datagrams {
		t.Fatalf("the backend node received %d of the %d datagrams the kernel held: %v", len(got), datagrams, got)
	}
}
