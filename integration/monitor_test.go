//go:build linux

package integration

import (
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/lbd-dev/lbd/internal/pktgen"
	"github.com/lbd-dev/lbd/internal/testnet"
	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/encoding/protojson"
)

// startMonitor runs `lbctl monitor` with args against an LB node's lbd and waits until
// lbd has turned its datapath's monitor on.
func (tb *testbed) startMonitor(t *testing.T, lb *node, name string, args ...string) *testnet.Proc {
	t.Helper()
	before := strings.Count(lb.lbd.proc.OwnLog(), "monitor on")
	cmd := exec.Command(tb.lbctlBin, append([]string{"-s", "unix://" + lb.lbd.sock, "monitor"}, args...)...)
	p := testnet.Start(t, name, filepath.Join(tb.dir, name+".log"), cmd)
	eventually(t, 10*time.Second, func() error {
		if !p.Running() {
			return fmt.Errorf("lbctl monitor exited:\n%s", p.Tail(20))
		}
		if strings.Count(lb.lbd.proc.OwnLog(), "monitor on") == before {
			return fmt.Errorf("lbd on %s has not turned its monitor on", lb.name)
		}
		return nil
	})
	return p
}

// waitExit waits for a process that is to end by itself.
func waitExit(t *testing.T, p *testnet.Proc, within time.Duration) {
	t.Helper()
	select {
	case <-p.Exited():
	case <-time.After(within):
		t.Fatalf("%s still runs after %v:\n%s", p.Name, within, p.Tail(20))
	}
}

// TestMonitor: while `lbctl monitor -w FILE` runs on an LB node, a malformed packet to
// the VIP and a packet to a VIP port without a service, sent to that node, are printed
// with the reasons the datapath dropped them for and their flows, and tshark reads both
// back from the pcap file; the monitor ends after --count events and lbd turns the
// datapath's monitor off. With --forwarded, a balanced HTTP request is printed with its
// service and backend, decoded from the encapsulated packet.
func TestMonitor(t *testing.T) {
	requireEnv(t, "tshark")
	tb := newLB(t, options{})
	lb := tb.lbs[0]
	pcap := filepath.Join(tb.dir, "monitor.pcap")
	mon := tb.startMonitor(t, lb, "lbctl-monitor", "-w", pcap, "--drops-only", "--count", "2")

	// Straight onto the LB node's uplink, as the router would send them.
	routerMAC := tb.routerNS.Interface(t, tb.routerFIf).HardwareAddr
	malformed := pktgen.Edit(pktgen.Packet{SrcMAC: routerMAC, DstMAC: lb.mac, Src: client4, Dst: vip4, SrcPort: 40001, DstPort: webPort,
		Payload: pktgen.Bytes(32)}.Frame(), func(b []byte, at pktgen.Offsets) { b[at.L4+12] = 0x40 }) // TCP data offset 4
	noService := pktgen.Packet{SrcMAC: routerMAC, DstMAC: lb.mac, Src: client4, Dst: vip4, SrcPort: 40002, DstPort: 9}.Frame()
	fd := tb.routerNS.PacketSocket(t, tb.routerFIf)
	for _, f := range [][]byte{malformed, noService} {
		if _, err := unix.Write(fd, f); err != nil {
			t.Fatalf("send frame: %v", err)
		}
	}
	waitExit(t, mon, 10*time.Second)
	out := mon.OwnLog()
	t.Logf("lbctl monitor printed:\n%s", out)
	for _, want := range []string{
		fmt.Sprintf("  malformed  XDP_DROP  %s  tcp %s:40001 > %s:%d  service web  %d bytes", lb.ifc, client4, vip4, webPort, len(malformed)),
		fmt.Sprintf("  no_service  XDP_DROP  %s  tcp %s:40002 > %s:9  %d bytes", lb.ifc, client4, vip4, len(noService)),
	} {
		if !strings.Contains(out, want) {
			t.Errorf("lbctl monitor did not print %q", want)
		}
	}
	eventually(t, 10*time.Second, func() error {
		if !strings.Contains(lb.lbd.proc.OwnLog(), "monitor off") {
			return fmt.Errorf("lbd has not turned its monitor off after the last monitor ended")
		}
		return nil
	})

	got := testnet.Run(t, "tshark", "-r", pcap, "-T", "fields", "-E", "separator=|",
		"-e", "frame.len", "-e", "frame.cap_len", "-e", "ip.src", "-e", "ip.dst", "-e", "tcp.srcport", "-e", "tcp.dstport", "-e", "tcp.hdr_len")
	lines := strings.Split(strings.TrimSpace(got), "\n")
	want := []string{
		fmt.Sprintf("%d|%d|%s|%s|40001|%d|16", len(malformed), len(malformed), client4, vip4, webPort),
		fmt.Sprintf("%d|%d|%s|%s|40002|9|20", len(noService), len(noService), client4, vip4),
	}
	if len(lines) != len(want) {
		t.Fatalf("tshark read %d packets from the pcap, want %d:\n%s", len(lines), len(want), got)
	}
	for i := range want {
		if lines[i] != want[i] {
			t.Errorf("tshark packet %d: %q, want %q", i, lines[i], want[i])
		}
	}

	// Balanced packets, asked for: the first one this node forwards.
	fwd := tb.startMonitor(t, lb, "lbctl-monitor-forwarded", "-o", "json", "--forwarded", "--reason", "forwarded", "--count", "1")
	tb.getMany(t, webVIP, 20)
	waitExit(t, fwd, 10*time.Second)
	// The log's first line is the command line testnet.Start wrote.
	logLines := strings.Split(fwd.OwnLog(), "\n")
	line := logLines[min(1, len(logLines)-1)]
	var resp lbdv1.MonitorDatapathResponse
	if err := protojson.Unmarshal([]byte(line), &resp); err != nil {
		t.Fatalf("lbctl monitor -o json printed %q: %v", line, err)
	}
	ev := resp.GetEvent()
	backends := map[string]bool{}
	for _, be := range tb.backends {
		backends[be.addr4.String()] = true
	}
	if ev.GetReason() != "forwarded" || ev.GetServiceName() != "web" || ev.GetSourceAddress() != client4.String() ||
		ev.GetDestinationAddress() != vip4.String() || ev.GetDestinationPort() != webPort || ev.GetIpProtocol() != 6 ||
		!backends[ev.GetBackendAddress()] || ev.GetBackendPort() != httpPort {
		t.Errorf("forwarded event %v: want a TCP packet of %v to %v (service web) sent to a backend's port %d", ev, client4, webVIP, httpPort)
	}
	if ev.GetVerdict() != "XDP_TX" && ev.GetVerdict() != "XDP_REDIRECT" || ev.GetHook() != "xdp" {
		t.Errorf("forwarded event with verdict %s, hook %q; want XDP_TX or XDP_REDIRECT by xdp", ev.GetVerdict(), ev.GetHook())
	}
}

// TestMonitorBackendNode: on a backend node, while `lbctl monitor -w FILE` runs, a
// Geneve packet from an LB node that carries lbd's DSR option in a control (OAM)
// packet is dropped by the node's TC ingress program and printed with that program's
// reason (as lbd_datapath_packets_total names it), its hook and interface, and the
// flow decoded from the inner packet and the option; tshark reads it back from the
// pcap file. The well-formed traffic the node decapsulates meanwhile is not reported.
func TestMonitorBackendNode(t *testing.T) {
	requireEnv(t, "tshark")
	tb := newLB(t, options{})
	lb, be := tb.lbs[0], tb.backends[0]
	pcap := filepath.Join(tb.dir, "monitor-backend.pcap")
	mon := tb.startMonitor(t, be, "lbctl-monitor-backend", "-w", pcap, "--count", "1")

	// Traffic the backend nodes decapsulate: no event.
	tb.getMany(t, webVIP, 10)
	// Straight from the LB node's uplink, as its XDP program would send it.
	inner := pktgen.Packet{Src: client4, Dst: be.addr4, SrcPort: 40011, DstPort: httpPort, Proto: pktgen.ProtoTCP,
		Flags: pktgen.SYN}.IP()
	oam := pktgen.Geneve{Outer: pktgen.Packet{SrcMAC: lb.mac, DstMAC: be.mac, Src: lb.addr4, Dst: be.addr4},
		VNI: 2, Options: []pktgen.GeneveOption{pktgen.DSROption(webVIP)}, OAM: true}.Frame(inner)
	fd := lb.ns.PacketSocket(t, lb.ifc)
	if _, err := unix.Write(fd, oam); err != nil {
		t.Fatalf("send frame: %v", err)
	}
	waitExit(t, mon, 10*time.Second)
	out := mon.OwnLog()
	t.Logf("lbctl monitor printed:\n%s", out)
	want := fmt.Sprintf("  backend_drop_bad_geneve  TCX_DROP  tc-ingress %s  tcp %s:40011 > %s  backend %s:%d  %d bytes",
		be.ifc, client4, webVIP, be.addr4, httpPort, len(oam))
	if !strings.Contains(out, want) {
		t.Errorf("lbctl monitor did not print %q", want)
	}

	got := strings.TrimSpace(testnet.Run(t, "tshark", "-r", pcap, "-T", "fields", "-E", "separator=|",
		"-e", "frame.len", "-e", "frame.cap_len", "-e", "ip.src", "-e", "ip.dst", "-e", "geneve.vni", "-e", "tcp.srcport"))
	wantPcap := fmt.Sprintf("%d|%d|%s,%s|%s,%s|0x000002|40011", len(oam), len(oam), lb.addr4, client4, be.addr4, be.addr4)
	if got != wantPcap {
		t.Errorf("tshark read %q from the pcap, want %q", got, wantPcap)
	}
}
