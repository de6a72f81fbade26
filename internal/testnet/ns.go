//go:build linux

package testnet

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/lbd-dev/lbd/internal/nsdo"
	"github.com/vishvananda/netns"
)

// NS is a named network namespace (/run/netns/Name) that lives until the test ends.
type NS struct {
	Name   string
	handle netns.NsHandle
}

// NewNS creates the namespace name with its loopback up; it is deleted at cleanup. It
// skips the test unless it runs as root with ip and nsenter.
func NewNS(tb testing.TB, name string) *NS {
	tb.Helper()
	Require(tb, "ip", "nsenter")
	Run(tb, "ip", "netns", "add", name)
	ns := &NS{Name: name, handle: -1}
	tb.Cleanup(func() {
		if ns.handle >= 0 {
			ns.handle.Close()
		}
		// A process still inside keeps the namespace alive, unnamed: processes are
		// stopped by their own, later-registered cleanups before this one runs.
		if _, err := Output(exec.Command("ip", "netns", "delete", name)); err != nil {
			tb.Errorf("delete namespace: %v", err)
		}
	})
	h, err := netns.GetFromName(name)
	if err != nil {
		tb.Fatalf("open netns %s: %v", name, err)
	}
	ns.handle = h
	ns.IP(tb, "link set lo up")
	return ns
}

// Do runs fn on a thread switched into the namespace (nsdo.Run); sockets fn opens stay
// in the namespace. It fails the test if the thread cannot switch.
func (ns *NS) Do(tb testing.TB, fn func()) {
	tb.Helper()
	if err := nsdo.Run(ns.handle, fn); err != nil {
		tb.Fatalf("netns %s: %v", ns.Name, err)
	}
}

// DoErr is Do for code that returns an error instead of failing the test, as code in
// another goroutine than the test's must.
func (ns *NS) DoErr(fn func() error) error {
	var ferr error
	if err := nsdo.Run(ns.handle, func() { ferr = fn() }); err != nil {
		return fmt.Errorf("netns %s: %w", ns.Name, err)
	}
	return ferr
}

// IP runs ip commands (one per line, without the leading "ip") in the namespace, in
// one process.
func (ns *NS) IP(tb testing.TB, lines ...string) {
	tb.Helper()
	cmd := exec.Command("ip", "-n", ns.Name, "-batch", "-")
	cmd.Stdin = strings.NewReader(strings.Join(lines, "\n") + "\n")
	if _, err := Output(cmd); err != nil {
		tb.Fatalf("%v\n%s", err, strings.Join(lines, "\n"))
	}
}

// AddAddr adds addresses to an interface of the namespace, IPv6 ones without duplicate
// address detection (they are usable at once). An address outside the plan fails the
// test.
func (ns *NS) AddAddr(tb testing.TB, dev string, prefixes ...netip.Prefix) {
	tb.Helper()
	var lines []string
	for _, p := range prefixes {
		if !InPlan(p.Addr()) {
			tb.Fatalf("%s is outside the test address plan (%s, %s, %s)", p, Nodes, VIPs, IPv6)
		}
		l := fmt.Sprintf("addr add %s dev %s", p, dev)
		if p.Addr().Is6() {
			l += " nodad"
		}
		lines = append(lines, l)
	}
	ns.IP(tb, lines...)
}

// Sysctl sets kernel parameters of the namespace ("net.ipv4.ip_forward=1"), writing
// /proc/sys from a thread inside it: /proc/sys/net belongs to the namespace of the
// thread that opens it.
func (ns *NS) Sysctl(tb testing.TB, settings ...string) {
	tb.Helper()
	err := ns.DoErr(func() error {
		for _, s := range settings {
			key, val, ok := strings.Cut(s, "=")
			if !ok {
				return fmt.Errorf("sysctl %q: want key=value", s)
			}
			path := "/proc/sys/" + strings.ReplaceAll(key, ".", "/")
			if err := os.WriteFile(path, []byte(val), 0o644); err != nil {
				return fmt.Errorf("sysctl %s: %w", s, err)
			}
		}
		return nil
	})
	if err != nil {
		tb.Fatal(err)
	}
}

// Interface returns an interface of the namespace (its index and MAC address).
func (ns *NS) Interface(tb testing.TB, name string) *net.Interface {
	tb.Helper()
	var ifc *net.Interface
	err := ns.DoErr(func() error {
		var err error
		ifc, err = net.InterfaceByName(name)
		return err
	})
	if err != nil {
		tb.Fatalf("interface %s in %s: %v", name, ns.Name, err)
	}
	return ifc
}

// Command prepares argv to run in the namespace. nsenter switches only the network
// namespace; `ip netns exec` would also remount /sys and hide a bpffs below it.
func (ns *NS) Command(argv ...string) *exec.Cmd {
	return exec.Command("nsenter", ns.nsenterArgs(argv)...)
}

// CommandContext is Command with a context that kills the command when done.
func (ns *NS) CommandContext(ctx context.Context, argv ...string) *exec.Cmd {
	return exec.CommandContext(ctx, "nsenter", ns.nsenterArgs(argv)...)
}

func (ns *NS) nsenterArgs(argv []string) []string {
	return append([]string{"--net=/run/netns/" + ns.Name, "--"}, argv...)
}

// Exec runs argv in the namespace and returns its standard output, failing the test on
// error.
func (ns *NS) Exec(tb testing.TB, argv ...string) string {
	tb.Helper()
	out, err := Output(ns.Command(argv...))
	if err != nil {
		tb.Fatal(err)
	}
	return out
}

// WaitUp waits until a new interface of the namespace transmits: until the kernel's
// link watcher has seen its carrier it keeps the noop qdisc, which drops every packet
// (a lost first SYN costs a one-second retransmission, a lost datagram the test).
func (ns *NS) WaitUp(tb testing.TB, dev string) {
	tb.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		out, err := Output(exec.Command("ip", "-n", ns.Name, "-o", "link", "show", "dev", dev))
		if err != nil {
			tb.Fatal(err)
		}
		if strings.Contains(out, "state UP") && !strings.Contains(out, "qdisc noop") {
			return
		}
		if time.Now().After(deadline) {
			tb.Fatalf("link %s in %s not up after 5 s: %s", dev, ns.Name, out)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// VethEnd is one end of a veth pair.
type VethEnd struct {
	NS   *NS
	Name string // at most 15 characters
	MTU  int    // 0: the kernel's default
	// MAC is the end's Ethernet address; nil: a random one.
	MAC net.HardwareAddr
}

func (e VethEnd) args() string {
	s := e.Name
	if e.MTU != 0 {
		s += fmt.Sprintf(" mtu %d", e.MTU)
	}
	if e.MAC != nil {
		s += " address " + e.MAC.String()
	}
	return s + " netns " + e.NS.Name
}

// Veth creates a veth pair between two ends (in the same namespace or in two) and sets
// both up. It goes with the namespaces.
func Veth(tb testing.TB, a, b VethEnd) {
	tb.Helper()
	for _, e := range []VethEnd{a, b} {
		if len(e.Name) > 15 {
			tb.Fatalf("interface name %q is longer than 15 characters", e.Name)
		}
	}
	Run(tb, strings.Fields(fmt.Sprintf("ip link add %s type veth peer name %s", a.args(), b.args()))...)
	a.NS.IP(tb, "link set "+a.Name+" up")
	b.NS.IP(tb, "link set "+b.Name+" up")
}

// HostNS returns a new namespace shaped like the host the example configurations are
// written for: lo and eth0 up (one end of a veth pair: this kernel has no dummy links). `lbd --check-config` checks the host
// it runs on (the interfaces and addresses the configuration names), so the tests of the
// examples run it there, whatever the machine running the tests calls its interfaces.
func HostNS(tb testing.TB) *NS {
	tb.Helper()
	ns := NewNS(tb, "lbdhost-"+Suffix(tb))
	ns.IP(tb, "link add eth0 type veth peer name eth0-peer", "link set eth0 up", "link set eth0-peer up")
	return ns
}
