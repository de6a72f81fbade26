//go:build linux

package datapath

import (
	"context"
	"fmt"
	"net/netip"
	"runtime"
	"time"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
	"github.com/lbd-dev/lbd/bpf/backendtc"
	"github.com/lbd-dev/lbd/bpf/lbxdp"
	"github.com/lbd-dev/lbd/daemon/model"
	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"
)

func protoNum(p lbdv1.Protocol) (uint8, error) {
	switch p {
	case lbdv1.Protocol_PROTOCOL_TCP:
		return lbxdp.ProtoTCP, nil
	case lbdv1.Protocol_PROTOCOL_UDP:
		return lbxdp.ProtoUDP, nil
	case lbdv1.Protocol_PROTOCOL_SCTP:
		return lbxdp.ProtoSCTP, nil
	}
	return 0, status.Errorf(codes.InvalidArgument, "protocol: %v is not TCP, UDP or SCTP", p)
}

// protoName is the lower-case name of a protocol number the datapath balances.
func protoName(p uint8) string {
	return backendtc.Proto(p).String()
}

func protoEnum(p uint8) lbdv1.Protocol {
	switch p {
	case lbxdp.ProtoUDP:
		return lbdv1.Protocol_PROTOCOL_UDP
	case lbxdp.ProtoSCTP:
		return lbdv1.Protocol_PROTOCOL_SCTP
	}
	return lbdv1.Protocol_PROTOCOL_TCP
}

// TraceFlow runs the loaded XDP program on a packet of the flow (a TCP SYN, a UDP
// datagram, an SCTP INIT) and reports what it did. A conntrack entry the trace itself creates is
// removed again, so tracing leaves no flow behind.
func (m *Manager) TraceFlow(_ context.Context, f model.Flow) (*lbdv1.TraceFlowResponse, error) {
	if m.lb == nil {
		return nil, status.Error(codes.FailedPrecondition, "trace: this node has no LB role")
	}
	proto, err := protoNum(f.Protocol)
	if err != nil {
		return nil, err
	}
	flow := lbxdp.Flow{Src: f.Src, Dst: f.Dst, Proto: proto}
	var payload []byte
	if cid := f.QUICDestinationConnectionID; len(cid) > 0 {
		if proto != lbxdp.ProtoUDP || len(cid) > 20 {
			return nil, status.Error(codes.InvalidArgument, "trace: quic_destination_connection_id: 1-20 bytes, UDP only")
		}
		payload = quicShortHeader(cid)
	}
	frame, err := buildFrame(flow, payload)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "trace: build packet: %v", err)
	}
	ct, hadCT, err := m.lb.ConntrackLookup(flow)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "trace: %v", err)
	}
	// A trace run has no side effects: no conntrack entry, no counter.
	res, err := m.runTrace(frame)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "trace: %v", err)
	}
	resp := &lbdv1.TraceFlowResponse{Verdict: res.Verdict.String()}
	m.mu.Lock()
	defer m.mu.Unlock()
	attached, why := m.attachment()
	var svc *programmed
	for _, p := range m.programmed {
		if p.key.VIP == f.Dst.Addr() && p.key.Proto == proto && (p.key.Port == f.Dst.Port() || (p.key.Port == 0 && svc == nil)) {
			svc = p
		}
	}
	if svc == nil {
		resp.Reason = "no service on this VIP, port and protocol: the packet is not for the load balancer"
		return resp, nil
	}
	resp.ServiceName = svc.name
	inner, forwarded := innerDestination(res.Frame)
	var bid uint32
	if forwarded {
		for id, k := range svc.backendKeys {
			if k.Addr() == inner.Addr() && (k.Port() == inner.Port() || k.Port() == 0) {
				bid = id
			}
		}
		resp.Backend = &lbdv1.Backend{Id: bid, Address: inner.Addr().String(), Port: uint32(inner.Port())}
		if b, ok := svc.backends[bid]; ok {
			resp.Backend.NodeAddress = b.Node.String()
		}
	}
	choice := ""
	switch {
	case forwarded && res.QUIC == lbxdp.QUICRouted:
		choice = "QUIC: the server ID in the destination connection ID names this backend (conntrack and the Maglev table are not consulted)"
	case forwarded && hadCT && ct.BackendID == bid:
		choice = fmt.Sprintf("existing flow: its conntrack entry (state %s) keeps it on this backend", ct.State)
	case forwarded && svc.svc.AffinityTimeout > 0:
		choice = fmt.Sprintf("new flow: session affinity or the Maglev table (size %d) chose this backend", svc.table.size)
	case forwarded:
		choice = fmt.Sprintf("new flow: the Maglev table (size %d) chose this backend", svc.table.size)
	}
	if why := quicFallback(res.QUIC); why != "" && forwarded {
		choice = why + "; " + choice
	}
	resp.Reason = traceReason(res, choice)
	if !attached {
		// The loaded program answered, but no packet reaches it.
		resp.Verdict = "NOT_ATTACHED"
		resp.Reason = "the XDP program is not attached: packets to the VIP are not load balanced on this node (" + why +
			"); had it been, " + resp.Reason
	}
	return resp, nil
}

// traceReason says in words why the program gave its verdict, from what it reported
// (lb_trace_meta) and, for a forwarded packet, how the backend was chosen.
func traceReason(res lbxdp.TraceResult, choice string) string {
	fib := ""
	if res.FIBLookedUp {
		fib = " (bpf_fib_lookup: " + res.FIBResult.String() + ")"
	}
	if !res.HasReason {
		if choice != "" {
			return choice
		}
		return "passed to the kernel: not a packet the load balancer handles"
	}
	switch res.Reason {
	case lbxdp.PassNoNeighbour:
		return choice + "; the next hop toward the backend's node is not resolved yet, so the encapsulated packet goes " +
			"through the kernel, which resolves it" + fib
	case lbxdp.DropNoRoute:
		return "dropped: no route toward the backend's node" + fib
	case lbxdp.DropFIB:
		return "dropped: the route lookup toward the backend's node failed" + fib
	case lbxdp.DropRejected:
		return "no usable backend: answered with a TCP reset or ICMP port unreachable"
	case lbxdp.DropNoBackend:
		return "no usable backend: dropped, as the service asks"
	case lbxdp.DropSourceRange:
		return "dropped: the client is outside the service's allowed source ranges"
	case lbxdp.DropTooBig:
		return "too big once encapsulated: answered with ICMP fragmentation needed / packet too big"
	}
	return "dropped: " + res.Reason.String()
}

// runTrace runs the program from a thread in the daemon's network namespace (the FIB
// lookup uses the caller's).
func (m *Manager) runTrace(frame []byte) (lbxdp.TraceResult, error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	return m.lb.TraceResult(frame, m.ifindex)
}

// quicShortHeader is a QUIC 1-RTT packet to dcid, as much of one as the datapath reads:
// the header, a packet number, and room for the protected payload.
func quicShortHeader(dcid []byte) []byte {
	return append(append([]byte{0x41}, dcid...), make([]byte, 24)...)
}

// quicFallback says why a QUIC service's packet took the 5-tuple path, "" if it did not.
func quicFallback(r lbxdp.QUICRoute) string {
	switch r {
	case lbxdp.QUICClientCID:
		return "QUIC: an Initial or 0-RTT packet (a connection ID the client chose) is balanced by its 5-tuple"
	case lbxdp.QUICUnknownID:
		return "QUIC: the connection ID names no backend of the service (another config rotation, or an unknown or removed server ID), so the 5-tuple decides"
	case lbxdp.QUICMalformed:
		return "QUIC: no connection ID of the configured form (too short, or a long header no client sends), so the 5-tuple decides"
	}
	return ""
}

// buildFrame builds a packet of the flow: a TCP SYN, an SCTP INIT, or a UDP datagram
// (with payload, or a default one).
func buildFrame(f lbxdp.Flow, payload []byte) ([]byte, error) {
	eth := &layers.Ethernet{SrcMAC: []byte{2, 0, 0, 0, 0, 1}, DstMAC: []byte{2, 0, 0, 0, 0, 2}}
	var ip gopacket.NetworkLayer
	var l []gopacket.SerializableLayer
	if f.Src.Addr().Is4() {
		eth.EthernetType = layers.EthernetTypeIPv4
		v4 := &layers.IPv4{Version: 4, TTL: 64, Flags: layers.IPv4DontFragment, SrcIP: f.Src.Addr().AsSlice(), DstIP: f.Dst.Addr().AsSlice()}
		ip, l = v4, []gopacket.SerializableLayer{eth, v4}
		v4.Protocol = layers.IPProtocol(f.Proto)
	} else {
		eth.EthernetType = layers.EthernetTypeIPv6
		v6 := &layers.IPv6{Version: 6, HopLimit: 64, SrcIP: f.Src.Addr().AsSlice(), DstIP: f.Dst.Addr().AsSlice()}
		ip, l = v6, []gopacket.SerializableLayer{eth, v6}
		v6.NextHeader = layers.IPProtocol(f.Proto)
	}
	switch f.Proto {
	case lbxdp.ProtoTCP:
		tcp := &layers.TCP{SrcPort: layers.TCPPort(f.Src.Port()), DstPort: layers.TCPPort(f.Dst.Port()), SYN: true, Seq: 1, Window: 65535}
		if err := tcp.SetNetworkLayerForChecksum(ip); err != nil {
			return nil, err
		}
		l = append(l, tcp)
	case lbxdp.ProtoSCTP:
		l = append(l, &layers.SCTP{SrcPort: layers.SCTPPort(f.Src.Port()), DstPort: layers.SCTPPort(f.Dst.Port())},
			&layers.SCTPInit{
				SCTPChunk:   layers.SCTPChunk{Type: layers.SCTPChunkTypeInit},
				InitiateTag: 1, AdvertisedReceiverWindowCredit: 65535, OutboundStreams: 1, InboundStreams: 1, InitialTSN: 1,
			})
	default:
		udp := &layers.UDP{SrcPort: layers.UDPPort(f.Src.Port()), DstPort: layers.UDPPort(f.Dst.Port())}
		if err := udp.SetNetworkLayerForChecksum(ip); err != nil {
			return nil, err
		}
		if payload == nil {
			payload = []byte("lbd trace")
		}
		l = append(l, udp, gopacket.Payload(payload))
	}
	buf := gopacket.NewSerializeBuffer()
	err := gopacket.SerializeLayers(buf, gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true}, l...)
	return buf.Bytes(), err
}

// innerDestination decodes an encapsulated output frame and returns the inner packet's
// destination (the backend).
func innerDestination(frame []byte) (netip.AddrPort, bool) {
	pkt := gopacket.NewPacket(frame, layers.LayerTypeEthernet, gopacket.Default)
	gen, ok := pkt.Layer(layers.LayerTypeGeneve).(*layers.Geneve)
	if !ok {
		return netip.AddrPort{}, false
	}
	inner := gopacket.NewPacket(gen.Payload, layers.LayerTypeEthernet, gopacket.Default)
	var addr netip.Addr
	switch ip := inner.NetworkLayer().(type) {
	case *layers.IPv4:
		addr, _ = netip.AddrFromSlice(ip.DstIP.To4())
	case *layers.IPv6:
		addr, _ = netip.AddrFromSlice(ip.DstIP)
	default:
		return netip.AddrPort{}, false
	}
	var port uint16
	switch t := inner.TransportLayer().(type) {
	case *layers.TCP:
		port = uint16(t.DstPort)
	case *layers.UDP:
		port = uint16(t.DstPort)
	case *layers.SCTP:
		port = uint16(t.DstPort)
	}
	return netip.AddrPortFrom(addr, port), true
}

// ListConnections lists conntrack entries (LB role) and NAT entries (backend role), or
// counts them (count_only).
func (m *Manager) ListConnections(_ context.Context, r *lbdv1.ListConnectionsRequest) (*lbdv1.ListConnectionsResponse, error) {
	limit := int(r.Limit)
	if limit == 0 {
		limit = 1000
	}
	match := func(s string, a netip.Addr) bool { return s == "" || s == a.String() }
	matchBackend := func(be netip.AddrPort) bool {
		return match(r.BackendAddress, be.Addr()) && (r.BackendPort == 0 || uint32(be.Port()) == r.BackendPort)
	}
	resp := &lbdv1.ListConnectionsResponse{}
	var page *connPage
	if size := int(r.GetPageSize()); size != 0 && !r.CountOnly {
		if size < 0 {
			return nil, status.Errorf(codes.InvalidArgument, "page_size: %d is negative", size)
		}
		after, err := decodeConnPageToken(r)
		if err != nil {
			return nil, err
		}
		page = &connPage{after: after, size: min(size, MaxConnectionPage)}
	}
	add := func(k connKey, c func() *lbdv1.Connection) bool {
		switch {
		case r.CountOnly:
			resp.MatchedCount++
		case page != nil:
			page.offer(k, c)
		case len(resp.Connections) >= limit:
			resp.Truncated = true
			return false
		default:
			resp.Connections = append(resp.Connections, c())
		}
		return true
	}
	if m.lb != nil {
		m.mu.Lock()
		backends := map[uint32]netip.AddrPort{}
		for _, p := range m.programmed {
			for id, k := range p.backendKeys {
				backends[id] = k
			}
		}
		m.mu.Unlock()
		now := lbxdp.MonotonicNow()
		wall := time.Now()
		err := m.lb.Conntrack(func(e lbxdp.CTEntry) bool {
			be := backends[e.BackendID]
			if !match(r.Vip, e.Flow.Dst.Addr()) || !match(r.ClientAddress, e.Flow.Src.Addr()) || !matchBackend(be) {
				return true
			}
			if r.OpenOnly && (e.Expired(now) || e.State == lbxdp.CTClosing || e.State == lbxdp.CTSCTPShutdown || e.State == lbxdp.CTSCTPClosed) {
				return true
			}
			return add(connKey{Table: tableConntrack, Proto: e.Flow.Proto, Client: e.Flow.Src, VIP: e.Flow.Dst, Backend: be}, func() *lbdv1.Connection {
				return &lbdv1.Connection{
					Protocol: protoEnum(e.Flow.Proto), Table: "conntrack",
					ClientAddress: e.Flow.Src.Addr().String(), ClientPort: uint32(e.Flow.Src.Port()),
					Vip: e.Flow.Dst.Addr().String(), VipPort: uint32(e.Flow.Dst.Port()),
					BackendAddress: addrString(be.Addr()), BackendPort: uint32(be.Port()),
					LastSeenTime: timestamppb.New(wall.Add(e.LastSeen - now)),
				}
			})
		})
		if err != nil {
			return nil, status.Errorf(codes.Internal, "list conntrack: %v", err)
		}
	}
	if m.be != nil && !resp.Truncated {
		entries, err := m.be.NATEntries()
		if err != nil {
			return nil, status.Errorf(codes.Internal, "list NAT: %v", err)
		}
		nat := m.natTable()
		for _, e := range entries {
			if !match(r.Vip, e.VIP.Addr()) || !match(r.ClientAddress, e.Client.Addr()) || !matchBackend(e.Backend) {
				continue
			}
			if r.OpenOnly && (e.Closing || nat.expired(e)) {
				continue
			}
			if !add(connKey{Table: tableNAT, Proto: uint8(e.Proto), Client: e.Client, VIP: e.VIP, Backend: e.Backend}, func() *lbdv1.Connection {
				return &lbdv1.Connection{
					Protocol: protoEnum(uint8(e.Proto)), Table: "nat",
					ClientAddress: e.Client.Addr().String(), ClientPort: uint32(e.Client.Port()),
					Vip: e.VIP.Addr().String(), VipPort: uint32(e.VIP.Port()),
					BackendAddress: e.Backend.Addr().String(), BackendPort: uint32(e.Backend.Port()),
					LastSeenTime: timestamppb.New(e.LastSeen),
				}
			}) {
				break
			}
		}
	}
	if page != nil {
		page.fill(resp, connFilters(r))
	}
	return resp, nil
}

func addrString(a netip.Addr) string {
	if !a.IsValid() {
		return ""
	}
	return a.String()
}
