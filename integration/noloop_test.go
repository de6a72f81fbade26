//go:build linux

package integration

import (
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/lbd-dev/lbd/internal/pktgen"
	"golang.org/x/sys/unix"
)

// sendFrames writes raw frames out of the client's link, addressed to the router.
func (tb *testbed) sendFrames(t *testing.T, frames ...[]byte) {
	t.Helper()
	fd := tb.clientNS.PacketSocket(t, tb.clientIf)
	idx := tb.clientNS.Interface(t, tb.clientIf).Index
	for _, f := range frames {
		if err := unix.Sendto(fd, f, 0, &unix.SockaddrLinklayer{Ifindex: idx, Halen: 6}); err != nil {
			t.Fatalf("send raw frame: %v", err)
		}
	}
}

// TestNoLoops: traffic for a VIP that no service takes (another port, another
// protocol, a ping) and IPv6 with more extension headers than lbd follows never leave
// an LB node again: LB nodes have a default route through the router, as real hosts
// do, so anything handed to their kernel would bounce between LB node and router until
// its TTL ran out. The router's fabric link must see none of it come back.
func TestNoLoops(t *testing.T) {
	requireEnv(t, "ping")
	tb := newLB(t, options{})
	var web6 []string
	for _, be := range tb.backends {
		web6 = append(web6, netip.AddrPortFrom(be.addr6, httpPort).String())
	}
	tb.createService(t, svcSpec{"web6", vip6, webPort, "tcp", web6})
	tb.router.waitNextHops(t, vip6, tb.lbs, 15*time.Second)

	caps := tb.routerNS.Capture(t, tb.routerFIf)
	for i := 0; i < 3; i++ {
		c, err := tb.dial("udp", netip.AddrPortFrom(vip4, 5999))
		if err != nil {
			t.Fatal(err)
		}
		c.Write([]byte("nobody listens"))
		c.Close()
	}
	if c, err := tb.dial("tcp", netip.AddrPortFrom(vip4, 8888)); err == nil {
		c.Close()
		t.Errorf("a connection to a VIP port without service succeeded")
	}
	out, _ := tb.clientNS.Command("ping", "-c", "2", "-i", "0.2", "-W", "1", vip4.String()).CombinedOutput()
	t.Logf("ping the VIP: %s", lastLine(out))
	rmac := tb.routerNS.Interface(t, tb.routerCIf).HardwareAddr
	cmac := tb.clientNS.Interface(t, tb.clientIf).HardwareAddr
	var frames [][]byte
	for i := range 3 {
		frames = append(frames, pktgen.Packet{SrcMAC: cmac, DstMAC: rmac, Src: client6, Dst: vip6, Proto: pktgen.ProtoUDP,
			SrcPort: uint16(30000 + i), DstPort: 53, DestOpts: 5, TTL: 64, Payload: []byte("five headers")}.Frame())
	}
	tb.sendFrames(t, frames...)
	time.Sleep(time.Second)

	back := 0
	for _, f := range caps.Stop() {
		if d, ok := decode(f); ok && !f.Outgoing && (d.dst == vip4 || d.dst == vip6) {
			back++
		}
	}
	if back != 0 {
		t.Errorf("%d packets to a VIP came back from the LB nodes to the router", back)
	}
	var noService, extHeaders uint64
	for _, lb := range tb.lbs {
		noService += lb.lbd.reasonCount(t, "lb_drop_no_service")
		extHeaders += lb.lbd.reasonCount(t, "lb_drop_ipv6_ext_headers")
	}
	t.Logf("dropped by the LB nodes: %d without service, %d with too many extension headers; %d came back", noService, extHeaders, back)
	if noService < 5 || extHeaders != 3 {
		t.Errorf("counted %d no_service (want at least 3 UDP, 1 SYN, 2 pings) and %d ipv6_ext_headers (want 3)", noService, extHeaders)
	}
}

func lastLine(b []byte) string {
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return lines[len(lines)-1]
}
