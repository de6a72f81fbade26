//go:build linux

package testnet

import (
	"errors"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
)

func TestInPlan(t *testing.T) {
	for a, want := range map[string]bool{
		"198.18.0.1": true, "198.19.255.254": true, "203.0.113.10": true, "2001:db8:f::1": true,
		"::ffff:198.18.0.1": true,
		"198.20.0.1":        false, "192.0.2.1": false, "10.0.0.1": false, "2001:db9::1": false,
	} {
		if got := InPlan(netip.MustParseAddr(a)); got != want {
			t.Errorf("InPlan(%s) = %v, want %v", a, got, want)
		}
	}
}

// TestNetwork builds two namespaces joined by a veth, sends a UDP datagram across,
// sees it in a capture, and checks that the cleanup leaves no namespace, mount or
// process behind.
func TestNetwork(t *testing.T) {
	Require(t, "ip", "nsenter", "sleep")
	sfx := Suffix(t)
	names := []string{"tn-a-" + sfx, "tn-b-" + sfx}
	ifA, ifB := "tna"+sfx, "tnb"+sfx
	mac := net.HardwareAddr{0x02, 0, 0, 0, 0xee, 0x01}
	src := netip.MustParsePrefix("198.18.250.1/24")
	dst := netip.MustParseAddrPort("198.18.250.2:4789")
	var sleep *Proc
	var bpffs string

	t.Run("build", func(t *testing.T) {
		a, b := NewNS(t, names[0]), NewNS(t, names[1])
		Veth(t, VethEnd{NS: a, Name: ifA, MTU: 1600, MAC: mac}, VethEnd{NS: b, Name: ifB, MTU: 1600})
		a.AddAddr(t, ifA, src, netip.MustParsePrefix("2001:db8:250::1/64"))
		b.AddAddr(t, ifB, netip.PrefixFrom(dst.Addr(), 24))
		if ifc := a.Interface(t, ifA); ifc.HardwareAddr.String() != mac.String() || ifc.MTU != 1600 {
			t.Errorf("%s: MAC %s MTU %d, want %s and 1600", ifA, ifc.HardwareAddr, ifc.MTU, mac)
		}
		host := Run(t, "cat", "/proc/sys/net/ipv4/ip_forward")
		b.Sysctl(t, "net.ipv4.ip_forward=1")
		if got := strings.TrimSpace(b.Exec(t, "cat", "/proc/sys/net/ipv4/ip_forward")); got != "1" {
			t.Errorf("ip_forward in %s is %q after Sysctl", b.Name, got)
		}
		if got := Run(t, "cat", "/proc/sys/net/ipv4/ip_forward"); got != host {
			t.Errorf("Sysctl in a namespace changed the host's ip_forward from %q to %q", host, got)
		}
		// The datagram crosses an XDP_PASS program on its way in.
		b.PassXDP(t, ifB)
		a.WaitUp(t, ifA)
		b.WaitUp(t, ifB)

		capture := b.Capture(t, ifB)
		var conn net.PacketConn
		b.Do(t, func() {
			var err error
			if conn, err = net.ListenPacket("udp", dst.String()); err != nil {
				t.Fatal(err)
			}
		})
		defer conn.Close()
		a.Do(t, func() {
			c, err := net.Dial("udp", dst.String())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if _, err := c.Write([]byte("hello")); err != nil {
				t.Fatal(err)
			}
		})
		conn.SetReadDeadline(time.Now().Add(5 * time.Second))
		buf := make([]byte, 64)
		n, from, err := conn.ReadFrom(buf)
		if err != nil || string(buf[:n]) != "hello" || from.(*net.UDPAddr).AddrPort().Addr() != src.Addr() {
			t.Fatalf("received %q from %v: %v", buf[:n], from, err)
		}
		var seen, outgoing int
		for _, f := range capture.Stop() {
			if f.Outgoing {
				outgoing++ // b's ARP reply
				continue
			}
			p := gopacket.NewPacket(f.Data, layers.LayerTypeEthernet, gopacket.Default)
			if u, ok := p.Layer(layers.LayerTypeUDP).(*layers.UDP); ok && uint16(u.DstPort) == dst.Port() && string(u.Payload) == "hello" {
				seen++
			}
		}
		if seen != 1 || outgoing == 0 {
			t.Errorf("capture saw the datagram %d times and %d outgoing frames; want 1 and some", seen, outgoing)
		}

		sleep = Start(t, "sleep", filepath.Join(t.TempDir(), "sleep.log"), a.Command("sleep", "600"))
		if !sleep.Running() {
			t.Error("sleep is not running")
		}
		bpffs = BPFFS(t)
		if err := os.WriteFile(filepath.Join(bpffs, "x"), nil, 0o600); err == nil {
			t.Error("a bpffs accepted a regular file: not a bpffs")
		}
	})

	if sleep.Running() {
		t.Error("the process still runs after the test")
	}
	out, err := exec.Command("ip", "netns", "list").CombinedOutput()
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range names {
		if strings.Contains(string(out), n) {
			t.Errorf("namespace %s left behind: %s", n, out)
		}
	}
	mounts, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(mounts), filepath.Dir(bpffs)) {
		t.Errorf("bpffs %s still mounted", bpffs)
	}
	if _, err := os.Stat(filepath.Dir(bpffs)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("bpffs directory left behind: %v", err)
	}
}
