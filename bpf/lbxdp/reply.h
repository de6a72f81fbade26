/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Packets the LB node answers itself, sent back out of the ingress port
 * (included by lbxdp.c after its maps): ICMP/ICMPv6 errors (port unreachable,
 * fragmentation needed, packet too big) and TCP resets. */
#ifndef LBXDP_REPLY_H
#define LBXDP_REPLY_H

/* Bytes of the offending packet quoted in ICMP errors we generate: covers the IP
 * header with options (60) or an IPv6 header with extension headers, plus the
 * transport ports. */
#define LB_ICMP_QUOTE_MAX 128
#define LB_ICMP_QUOTE_MIN 28

/* Save the link-layer header (with its VLAN tag) so a reply can reuse it with
 * the addresses swapped. */
struct lb_l2 {
	__u8 b[LBD_ETH_HLEN + LBD_VLAN_HLEN];
};

LBD_INLINE int lb_l2_save(void *data, void *data_end, __u32 l3, struct lb_l2 *l2)
{
	if (l3 == LBD_ETH_HLEN) {
		if (data + LBD_ETH_HLEN > data_end)
			return -1;
		__builtin_memcpy(l2->b, data, LBD_ETH_HLEN);
	} else {
		if (data + LBD_ETH_HLEN + LBD_VLAN_HLEN > data_end)
			return -1;
		__builtin_memcpy(l2->b, data, LBD_ETH_HLEN + LBD_VLAN_HLEN);
	}
	return 0;
}

/* Write the saved link-layer header back with source and destination swapped. */
LBD_INLINE int lb_l2_reply(void *data, void *data_end, __u32 l3, const struct lb_l2 *l2)
{
	struct lbd_ethhdr *eth = data;

	if (data + LBD_ETH_HLEN + LBD_VLAN_HLEN > data_end)
		return -1;
	__builtin_memcpy(eth->dst, l2->b + LBD_ETH_ALEN, LBD_ETH_ALEN);
	__builtin_memcpy(eth->src, l2->b, LBD_ETH_ALEN);
	/* Ethertype, then the VLAN tag's TCI and inner ethertype if there is one
	 * (the bounds check above covers both). */
	if (l3 == LBD_ETH_HLEN)
		__builtin_memcpy(data + 12, l2->b + 12, 2);
	else
		__builtin_memcpy(data + 12, l2->b + 12, 2 + LBD_VLAN_HLEN);
	return 0;
}

/* Answer the client with an ICMP or ICMPv6 error quoting the start of its packet,
 * sent from the VIP back out of the ingress port (XDP_TX). info is the 32-bit
 * type-specific word (the MTU for too-big messages). */
LBD_INLINE int lb_icmp_reply(struct xdp_md *ctx, struct lb_pkt *pk, __u8 type, __u8 code, __u32 info)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	__u32 l3 = pk->p.l3_off & LBD_L3_MASK, qlen = pk->ip_len, frame_len = data_end - data, hlen, qlen4;
	__u8 quote[LB_ICMP_QUOTE_MAX];
	struct lbd_icmphdr *icmp;
	struct lb_l2 l2;
	__u64 sum;

	if (qlen > LB_ICMP_QUOTE_MAX)
		qlen = LB_ICMP_QUOTE_MAX;
	if (qlen < LB_ICMP_QUOTE_MIN || l3 > LBD_ETH_HLEN + LBD_VLAN_HLEN)
		return lb_drop(pk, LB_DROP_INTERNAL);
	if (lb_l2_save(data, data_end, l3, &l2))
		return lb_drop(pk, LB_DROP_INTERNAL);
	__builtin_memset(quote, 0, sizeof(quote));
	if (bpf_xdp_load_bytes(ctx, l3, quote, qlen))
		return lb_drop(pk, LB_DROP_INTERNAL);
	/* The zeroed tail pads an odd length, as the checksum rules ask. */
	qlen4 = (qlen + 3) & ~3U;
	if (qlen4 > LB_ICMP_QUOTE_MAX)
		return lb_drop(pk, LB_DROP_INTERNAL);
	sum = bpf_csum_diff(NULL, 0, (void *)quote, qlen4, 0);

	hlen = pk->p.family == LBD_FAMILY_V4 ? sizeof(struct lbd_iphdr) : sizeof(struct lbd_ipv6hdr);
	hlen += sizeof(struct lbd_icmphdr);
	if (bpf_xdp_adjust_tail(ctx, (int)(l3 + qlen) - (int)frame_len))
		return lb_drop(pk, LB_DROP_INTERNAL);
	if (bpf_xdp_adjust_head(ctx, -(int)hlen))
		return lb_drop(pk, LB_DROP_INTERNAL);
	data = (void *)(long)ctx->data;
	data_end = (void *)(long)ctx->data_end;
	if (lb_l2_reply(data, data_end, l3, &l2))
		return lb_drop(pk, LB_DROP_INTERNAL);

	if (pk->p.family == LBD_FAMILY_V4) {
		struct lbd_iphdr *ip = data + l3;

		icmp = (void *)(ip + 1);
		if ((void *)(icmp + 1) > data_end)
			return lb_drop(pk, LB_DROP_INTERNAL);
		ip->ver_ihl = 0x45;
		ip->tos = 0xc0; /* internetwork control, as Linux sends ICMP errors */
		ip->tot_len = bpf_htons(hlen + qlen);
		ip->id = 0;
		ip->frag_off = 0;
		ip->ttl = 64;
		ip->protocol = LBD_IPPROTO_ICMP;
		ip->check = 0;
		__builtin_memcpy(&ip->saddr, pk->flow.daddr, 4);
		__builtin_memcpy(&ip->daddr, pk->flow.saddr, 4);
		ip->check = lbd_csum_ipv4_hdr(ip);
	} else {
		struct lbd_ipv6hdr *ip6 = data + l3;

		icmp = (void *)(ip6 + 1);
		if ((void *)(icmp + 1) > data_end)
			return lb_drop(pk, LB_DROP_INTERNAL);
		ip6->ver_tc_flow = bpf_htonl(6U << 28);
		ip6->payload_len = bpf_htons(sizeof(*icmp) + qlen);
		ip6->nexthdr = LBD_IPPROTO_ICMPV6;
		ip6->hop_limit = 64;
		__builtin_memcpy(ip6->saddr, pk->flow.daddr, 16);
		__builtin_memcpy(ip6->daddr, pk->flow.saddr, 16);
		sum += lbd_csum_pseudo6(ip6->saddr, ip6->daddr, LBD_IPPROTO_ICMPV6, sizeof(*icmp) + qlen);
	}
	icmp->type = type;
	icmp->code = code;
	icmp->un = bpf_htonl(info);
	icmp->check = 0;
	sum += (__u32)icmp->type + ((__u32)icmp->code << 8) + icmp->un;
	icmp->check = ~lbd_csum_fold(sum);
	return XDP_TX;
}

/* Answer a TCP packet with a RST as the VIP (RFC 9293 §3.10.7.1 for a closed port). */
LBD_INLINE int lb_tcp_reset(struct xdp_md *ctx, struct lb_pkt *pk)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	__u32 l3 = pk->p.l3_off & LBD_L3_MASK, l4 = pk->p.l4_off & LBD_L4_MASK, frame_len = data_end - data, hlen, seglen;
	struct lbd_tcphdr *tcp, otcp;
	struct lb_l2 l2;
	__u64 sum;

	if (l3 > LBD_ETH_HLEN + LBD_VLAN_HLEN || l4 > LBD_MAX_L4_OFF)
		return lb_drop(pk, LB_DROP_INTERNAL);
	tcp = data + l4;
	if ((void *)(tcp + 1) > data_end)
		return lb_drop(pk, LB_DROP_INTERNAL);
	otcp = *tcp;
	seglen = pk->p.ip_end - l4 - (otcp.doff_res >> 4) * 4;
	if (otcp.flags & LBD_TCP_SYN)
		seglen++;
	if (otcp.flags & LBD_TCP_FIN)
		seglen++;
	if (lb_l2_save(data, data_end, l3, &l2))
		return lb_drop(pk, LB_DROP_INTERNAL);

	hlen = pk->p.family == LBD_FAMILY_V4 ? sizeof(struct lbd_iphdr) : sizeof(struct lbd_ipv6hdr);
	if (bpf_xdp_adjust_tail(ctx, (int)(l3 + hlen + sizeof(*tcp)) - (int)frame_len))
		return lb_drop(pk, LB_DROP_INTERNAL);
	data = (void *)(long)ctx->data;
	data_end = (void *)(long)ctx->data_end;
	if (lb_l2_reply(data, data_end, l3, &l2))
		return lb_drop(pk, LB_DROP_INTERNAL);

	if (pk->p.family == LBD_FAMILY_V4) {
		struct lbd_iphdr *ip = data + l3;
		__be32 s, d;

		tcp = (void *)(ip + 1);
		if ((void *)(tcp + 1) > data_end)
			return lb_drop(pk, LB_DROP_INTERNAL);
		__builtin_memcpy(&s, pk->flow.daddr, 4);
		__builtin_memcpy(&d, pk->flow.saddr, 4);
		ip->ver_ihl = 0x45;
		ip->tos = 0;
		ip->tot_len = bpf_htons(sizeof(*ip) + sizeof(*tcp));
		ip->id = 0;
		ip->frag_off = bpf_htons(LBD_IP_DF);
		ip->ttl = 64;
		ip->protocol = LBD_IPPROTO_TCP;
		ip->check = 0;
		ip->saddr = s;
		ip->daddr = d;
		ip->check = lbd_csum_ipv4_hdr(ip);
		sum = lbd_csum_pseudo4(s, d, LBD_IPPROTO_TCP, sizeof(*tcp));
	} else {
		struct lbd_ipv6hdr *ip6 = data + l3;

		tcp = (void *)(ip6 + 1);
		if ((void *)(tcp + 1) > data_end)
			return lb_drop(pk, LB_DROP_INTERNAL);
		ip6->ver_tc_flow = bpf_htonl(6U << 28);
		ip6->payload_len = bpf_htons(sizeof(*tcp));
		ip6->nexthdr = LBD_IPPROTO_TCP;
		ip6->hop_limit = 64;
		__builtin_memcpy(ip6->saddr, pk->flow.daddr, 16);
		__builtin_memcpy(ip6->daddr, pk->flow.saddr, 16);
		sum = lbd_csum_pseudo6(ip6->saddr, ip6->daddr, LBD_IPPROTO_TCP, sizeof(*tcp));
	}
	tcp->source = otcp.dest;
	tcp->dest = otcp.source;
	if (otcp.flags & LBD_TCP_ACK) {
		tcp->seq = otcp.ack_seq;
		tcp->ack_seq = 0;
		tcp->flags = LBD_TCP_RST;
	} else {
		tcp->seq = 0;
		tcp->ack_seq = bpf_htonl(bpf_ntohl(otcp.seq) + seglen);
		tcp->flags = LBD_TCP_RST | LBD_TCP_ACK;
	}
	tcp->doff_res = 5 << 4;
	tcp->window = 0;
	tcp->check = 0;
	tcp->urg_ptr = 0;
	{
		const __u32 *w = (const __u32 *)tcp;

		sum += (__u64)w[0] + w[1] + w[2] + w[3] + w[4];
	}
	tcp->check = ~lbd_csum_fold(sum);
	return XDP_TX;
}

/* No usable backend: reject the way Kubernetes does (TCP RST, ICMP port
 * unreachable for UDP) unless the service asks for a silent drop. */
LBD_INLINE int lb_no_backend(struct xdp_md *ctx, struct lb_pkt *pk, const struct lb_service *svc)
{
	if (svc->flags & LB_SVC_DROP_NO_BE)
		return lb_drop(pk, LB_DROP_NO_BACKEND);
	lb_note(pk, LB_DROP_REJECTED);
	if (pk->p.proto == LBD_IPPROTO_TCP) {
		if (pk->tcp_flags & LBD_TCP_RST)
			return XDP_DROP; /* never answer a RST */
		return lb_tcp_reset(ctx, pk);
	}
	if (pk->p.family == LBD_FAMILY_V4)
		return lb_icmp_reply(ctx, pk, LBD_ICMP_DEST_UNREACH, LBD_ICMP_PORT_UNREACH, 0);
	return lb_icmp_reply(ctx, pk, LBD_ICMP6_DEST_UNREACH, LBD_ICMP6_PORT_UNREACH, 0);
}

/* The smallest MTU a too-big message may announce: IPv6's minimum link MTU (RFC 8200),
 * and IPv4's minimum datagram every host must accept (RFC 791). Receivers ignore or
 * raise a smaller one, so announcing it would only make the client retry packets that
 * still do not fit: a fabric that cannot carry these plus the encapsulation cannot
 * serve such clients, and their packets are counted as too_big_unsignaled. */
#define LB_MIN_MTU4 576
#define LB_MIN_MTU6 1280

/* The packet is too big for the tunnel. The client can use mtu minus the
 * encapsulation overhead (outer Ethernet is not part of the MTU). */
LBD_INLINE int lb_too_big(struct xdp_md *ctx, struct lb_pkt *pk, __u32 mtu, __u32 hdr)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	__u32 usable = mtu - (hdr - LBD_ETH_HLEN);

	if (mtu <= hdr - LBD_ETH_HLEN ||
	    usable < (pk->p.family == LBD_FAMILY_V4 ? LB_MIN_MTU4 : LB_MIN_MTU6))
		return lb_drop(pk, LB_DROP_TOO_BIG_UNSIGNALED);
	if (pk->p.family == LBD_FAMILY_V4) {
		struct lbd_iphdr *ip;

		if (pk->p.l3_off > LBD_ETH_HLEN + LBD_VLAN_HLEN)
			return lb_drop(pk, LB_DROP_INTERNAL);
		ip = data + (pk->p.l3_off & LBD_L3_MASK);
		if ((void *)(ip + 1) > data_end)
			return lb_drop(pk, LB_DROP_INTERNAL);
		if (!(ip->frag_off & bpf_htons(LBD_IP_DF)))
			return lb_drop(pk, LB_DROP_TOO_BIG_UNSIGNALED);
		lb_note(pk, LB_DROP_TOO_BIG);
		return lb_icmp_reply(ctx, pk, LBD_ICMP_DEST_UNREACH, LBD_ICMP_FRAG_NEEDED, usable & 0xffff);
	}
	lb_note(pk, LB_DROP_TOO_BIG);
	return lb_icmp_reply(ctx, pk, LBD_ICMP6_PKT_TOOBIG, 0, usable);
}

#endif
