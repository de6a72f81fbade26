package lbctl

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/signal"
	"syscall"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
	"github.com/gopacket/gopacket/pcapgo"
	"github.com/spf13/cobra"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
)

// monitorSnapLen is the pcap file's snapshot length: lbd sends at most this many bytes
// of a packet.
const monitorSnapLen = 128

func (a *app) monitorCommand() *cobra.Command {
	var (
		req   lbdv1.MonitorDatapathRequest
		write string
		count int
	)
	cmd := &cobra.Command{
		Use:   "monitor",
		Short: "Print the packets the datapath drops, answers or balances, as it does",
		Long: `Print, as they happen, the packets the LB node's datapath drops, answers (a TCP reset,
an ICMP error) or hands to the kernel, with the reason it gives for them (the reasons of
lbd_datapath_packets_total and lbctl trace), its verdict, the interface, and the client's
flow decoded from the packet's first bytes. With --forwarded, packets it balances to a
backend too (reason "forwarded"). On a backend node, the packets its TC programs drop
(reasons backend_drop_bad_geneve, backend_drop_malformed_option, ..., as
lbd_datapath_packets_total names them; verdict TCX_DROP), with the hook that dropped
them: tc-ingress (Geneve from an LB node) or tc-egress (a backend's reply). The datapath
samples and rate-limits what it reports (datapath.monitor in lbd's configuration), and
reports nothing while no monitor runs. A monitor that cannot keep up loses events and
says how many.

With -w FILE, the packets are also written to FILE in pcap format (their first 128
bytes, as the datapath left them: a dropped packet as it arrived, an answer as sent, a
forwarded packet encapsulated, a backend node's drop as it was when dropped), for tshark, tcpdump or Wireshark.

It runs until interrupted, until --count events, or until --timeout if one is given.
Needs the operator or admin role: the packets are clients' traffic.`,
		Example: "  lbctl monitor\n  lbctl monitor --drops-only --service web\n" +
			"  lbctl monitor --reason malformed --reason no_service -w drops.pcap\n  lbctl monitor --forwarded --count 10 -o json",
		Args: exactArgs(),
	}
	cmd.Flags().StringSliceVar(&req.Reasons, "reason", nil, "only packets with this reason (malformed, no_service, ..., forwarded; backend_drop_bad_geneve, ... on a backend node); repeat or separate with commas")
	cmd.Flags().StringSliceVar(&req.Services, "service", nil, "only packets for this service (a name or a pattern with *); repeat or separate with commas")
	cmd.Flags().BoolVar(&req.DropsOnly, "drops-only", false, "only packets the datapath dropped (verdict XDP_DROP or TCX_DROP)")
	cmd.Flags().BoolVar(&req.Forwarded, "forwarded", false, "also packets the datapath balanced to a backend")
	cmd.Flags().StringVarP(&write, "write", "w", "", "also write the packets to this pcap file (replaced if it exists)")
	cmd.Flags().IntVar(&count, "count", 0, "stop after this many events (0: no limit)")
	run := a.run(func(ctx context.Context, _ *cobra.Command, _ []string) error {
		if count < 0 {
			return usageErrorf("--count: %d must not be negative", count)
		}
		return a.monitor(ctx, &req, write, count)
	})
	cmd.RunE = func(c *cobra.Command, args []string) error {
		// Like a watch, the monitor runs until interrupted unless --timeout is given.
		a.waiting = true
		return run(c, args)
	}
	return cmd
}

// monitor follows the MonitorDatapath stream, printing each event (and writing it to
// the pcap file) as it comes.
func (a *app) monitor(ctx context.Context, req *lbdv1.MonitorDatapathRequest, file string, count int) error {
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	var pcap *pcapWriter
	if file != "" {
		var err error
		if pcap, err = createPcap(file); err != nil {
			return err
		}
		defer pcap.close()
	}
	lb, err := a.lb()
	if err != nil {
		return err
	}
	stream, err := lb.MonitorDatapath(ctx, req)
	if err != nil {
		return err
	}
	seen := 0
	for count == 0 || seen < count {
		resp, err := stream.Recv()
		switch {
		case err == nil:
		case errors.Is(err, io.EOF):
			return status.Error(codes.Unavailable, "lbd ended the monitor")
		case ctx.Err() != nil && status.Code(err) == codes.Canceled,
			status.Code(err) == codes.DeadlineExceeded && hasDeadline(ctx):
			// Interrupted, or the explicit --timeout passed: a normal end. lbd, which was
			// told the deadline, may end the stream a moment before ctx itself expires.
			return pcap.close()
		default:
			return err
		}
		a.opts.answered = true
		seen++
		if pcap != nil {
			if err := pcap.write(resp.GetEvent()); err != nil {
				return err
			}
		}
		if a.opts.output == "table" {
			writeMonitorEvent(&a.out, resp)
		} else if err := a.printEvent(resp); err != nil {
			return err
		}
		if err := a.flush(); err != nil {
			return err
		}
	}
	return pcap.close()
}

// writeMonitorEvent prints an event on one line:
//
//	15:04:05.000000  no_service  XDP_DROP  eth0  tcp 198.51.100.7:40000 > 203.0.113.10:8080  74 bytes
//
// A backend node's TC programs name their hook before the interface:
//
//	15:04:05.000000  backend_drop_bad_geneve  TCX_DROP  tc-ingress eth0  tcp 198.51.100.7:40000 > 203.0.113.10:80  backend 198.18.1.2:8080  124 bytes
func writeMonitorEvent(w io.Writer, r *lbdv1.MonitorDatapathResponse) {
	if r.GetLostEvents() > 0 {
		fmt.Fprintf(w, "(%d events lost: this monitor did not read them fast enough)\n", r.GetLostEvents())
	}
	e := r.GetEvent()
	iface := e.GetInterface()
	if iface == "" {
		iface = "-"
	}
	if h := e.GetHook(); h != "" && h != "xdp" {
		iface = h + " " + iface
	}
	fmt.Fprintf(w, "%s  %s  %s  %s  %s", e.GetTime().AsTime().Local().Format("15:04:05.000000"), e.GetReason(), e.GetVerdict(), iface, monitorFlow(e))
	if e.GetServiceName() != "" {
		fmt.Fprintf(w, "  service %s", e.GetServiceName())
	}
	if e.GetBackendAddress() != "" {
		fmt.Fprintf(w, "  backend %s", hostPort(e.GetBackendAddress(), e.GetBackendPort()))
	}
	fmt.Fprintf(w, "  %d bytes\n", e.GetLength())
}

// monitorFlow is the event's flow as "proto source > destination".
func monitorFlow(e *lbdv1.MonitorEvent) string {
	if e.GetSourceAddress() == "" && e.GetDestinationAddress() == "" {
		return "(headers not decoded)"
	}
	proto := map[uint32]string{1: "icmp", 6: "tcp", 17: "udp", 58: "icmpv6", 132: "sctp"}[e.GetIpProtocol()]
	if proto == "" {
		proto = fmt.Sprintf("ip-proto %d", e.GetIpProtocol())
	}
	ports := func(addr string, port uint32) string {
		if addr == "" {
			return "-"
		}
		if p := e.GetIpProtocol(); p != 6 && p != 17 && p != 132 {
			return addr
		}
		return hostPort(addr, port)
	}
	return fmt.Sprintf("%s %s > %s", proto, ports(e.GetSourceAddress(), e.GetSourcePort()), ports(e.GetDestinationAddress(), e.GetDestinationPort()))
}

func hostPort(addr string, port uint32) string {
	a, err := netip.ParseAddr(addr)
	if err != nil {
		return fmt.Sprintf("%s:%d", addr, port)
	}
	return netip.AddrPortFrom(a, uint16(port)).String()
}

// pcapWriter writes events to a pcap file as they come, so that the file is whole
// whenever the monitor stops.
type pcapWriter struct {
	f *os.File
	w *pcapgo.Writer
}

func createPcap(path string) (*pcapWriter, error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("pcap file: %w", err)
	}
	w := pcapgo.NewWriterNanos(f)
	if err := w.WriteFileHeader(monitorSnapLen, layers.LinkTypeEthernet); err != nil {
		f.Close()
		return nil, fmt.Errorf("pcap file %s: %w", path, err)
	}
	return &pcapWriter{f: f, w: w}, nil
}

func (p *pcapWriter) write(e *lbdv1.MonitorEvent) error {
	ci := gopacket.CaptureInfo{Timestamp: e.GetTime().AsTime(), CaptureLength: len(e.GetData()), Length: int(e.GetLength())}
	if ci.Length < ci.CaptureLength {
		ci.Length = ci.CaptureLength
	}
	if err := p.w.WritePacket(ci, e.GetData()); err != nil {
		return fmt.Errorf("pcap file %s: %w", p.f.Name(), err)
	}
	return nil
}

// close closes the file once; nil receiver (no file) and repeated calls do nothing.
func (p *pcapWriter) close() error {
	if p == nil || p.f == nil {
		return nil
	}
	err := p.f.Close()
	p.f = nil
	if err != nil {
		return fmt.Errorf("pcap file: %w", err)
	}
	return nil
}
