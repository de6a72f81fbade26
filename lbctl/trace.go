package lbctl

import (
	"context"
	"encoding/hex"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
)

func (a *app) traceCommand() *cobra.Command {
	protocols := enumLabels(lbdv1.Protocol(0).Descriptor())
	var quicDCID string
	cmd := &cobra.Command{
		Use:   "trace " + strings.Join(protocols, "|") + " SRC-ADDR SRC-PORT VIP PORT",
		Short: "Show which backend the datapath would choose for a flow, and why",
		Long: `Show which backend the datapath would choose for a flow, and why. lbd runs its
loaded program on a first packet of the flow (a TCP SYN, a UDP datagram, an SCTP INIT)
without sending it anywhere, and a conntrack entry the trace creates is removed again.
With --quic-dcid the UDP datagram is a QUIC 1-RTT packet to that connection ID, to see
whether a QUIC-aware service routes it by its server ID.`,
		Example: "  lbctl trace tcp 198.51.100.7 40000 203.0.113.10 443\n  lbctl trace udp 2001:db8:1::7 5353 2001:db8::10 53\n" +
			"  lbctl trace udp 198.51.100.7 50000 203.0.113.10 443 --quic-dcid 200b02deadbeef42",
		Args: exactArgs("PROTOCOL", "SRC-ADDR", "SRC-PORT", "VIP", "PORT"),
		ValidArgsFunction: a.completeArgs(
			func(context.Context, []string) []string { return protocols },
			noCompletion, noCompletion, a.completeVIPs),
		RunE: a.run(func(ctx context.Context, _ *cobra.Command, args []string) error {
			req, err := parseTraceArgs(args)
			if err != nil {
				return err
			}
			if quicDCID != "" {
				cid, err := hex.DecodeString(quicDCID)
				if err != nil || len(cid) > 20 || req.Protocol != lbdv1.Protocol_PROTOCOL_UDP {
					return usageErrorf("--quic-dcid %q: a connection ID of 1-20 bytes in hex, for udp only", quicDCID)
				}
				req.QuicDestinationConnectionId = cid
			}
			lb, err := a.lb()
			if err != nil {
				return err
			}
			resp, err := lb.TraceFlow(ctx, req)
			if err != nil {
				return err
			}
			return a.print(resp, func(w io.Writer) { writeTrace(w, req, resp) })
		}),
	}
	cmd.Flags().StringVar(&quicDCID, "quic-dcid", "", "trace a QUIC 1-RTT packet to this destination connection ID (hex)")
	return cmd
}

// noCompletion proposes nothing, for arguments such as ports.
func noCompletion(context.Context, []string) []string { return nil }

// parseTraceArgs checks the five arguments of trace: the daemon would refuse most
// mistakes too, but a usage error names the argument that is wrong.
func parseTraceArgs(args []string) (*lbdv1.TraceFlowRequest, error) {
	pd := lbdv1.Protocol(0).Descriptor()
	if !slices.Contains(enumLabels(pd), args[0]) {
		return nil, usageErrorf("protocol %q: must be one of %s", args[0], strings.Join(enumLabels(pd), ", "))
	}
	src, err := parseAddr(args[1])
	if err != nil {
		return nil, usageErrorf("source address: %v", err)
	}
	sport, err := parsePort(args[2])
	if err != nil {
		return nil, usageErrorf("source port: %v", err)
	}
	vip, err := parseAddr(args[3])
	if err != nil {
		return nil, usageErrorf("VIP: %v", err)
	}
	dport, err := parsePort(args[4])
	if err != nil {
		return nil, usageErrorf("port: %v", err)
	}
	if src.Is4() != vip.Is4() {
		return nil, usageErrorf("source address %s and VIP %s are not of the same IP version", src, vip)
	}
	return &lbdv1.TraceFlowRequest{
		Protocol:           lbdv1.Protocol(enumNumber(pd, args[0])),
		SourceAddress:      src.String(),
		SourcePort:         sport,
		DestinationAddress: vip.String(),
		DestinationPort:    dport,
	}, nil
}

func parsePort(s string) (uint32, error) {
	p, err := strconv.ParseUint(s, 10, 16)
	if err != nil {
		return 0, fmt.Errorf("%q is not a port (0-65535)", s)
	}
	return uint32(p), nil
}

func writeTrace(w io.Writer, req *lbdv1.TraceFlowRequest, resp *lbdv1.TraceFlowResponse) {
	flow := fmt.Sprintf("%s %s -> %s", label(req.Protocol, "-"),
		formatEndpoint(req.SourceAddress, req.SourcePort), formatEndpoint(req.DestinationAddress, req.DestinationPort))
	service := resp.ServiceName
	if service == "" {
		service = "none (no service on this VIP, port and protocol)"
	}
	backend := "none"
	if b := resp.Backend; b != nil {
		backend = formatEndpoint(b.Address, b.Port)
		if b.NodeAddress != "" && b.NodeAddress != b.Address {
			backend += " on node " + b.NodeAddress
		}
	}
	t := newTable(w)
	row(t, "Flow:", flow)
	row(t, "Service:", service)
	row(t, "Verdict:", dash(resp.Verdict))
	row(t, "Backend:", backend)
	row(t, "Reason:", dash(resp.Reason))
	t.Flush()
}
