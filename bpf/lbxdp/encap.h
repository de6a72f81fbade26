/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* DNAT of the client packet to its backend and the Geneve encapsulation with the
 * DSR option (bpf/include/wire.h) toward the backend's node (included by
 * lbxdp.c after its maps). */
#ifndef LBXDP_ENCAP_H
#define LBXDP_ENCAP_H

/* Bytes the encapsulation puts in front of the inner IP packet, outer Ethernet
 * included. */
LBD_INLINE __u32 lb_encap_len(__u8 node_family, __u8 vip_family)
{
	__u32 ip = node_family == LBD_FAMILY_V4 ? sizeof(struct lbd_iphdr) : sizeof(struct lbd_ipv6hdr);
	__u32 opt = vip_family == LBD_FAMILY_V4 ? sizeof(struct lbd_dsr_opt4) : sizeof(struct lbd_dsr_opt6);

	return LBD_ETH_HLEN + ip + sizeof(struct lbd_udphdr) + sizeof(struct lbd_genevehdr) + opt + LBD_ETH_HLEN;
}

/* Rewrite the client packet's destination to the backend (address, and port
 * unless the backend keeps the client's port), fixing IP and L4 checksums. An SCTP
 * packet keeps its port: its CRC32c covers no addresses, but the ports (the control
 * plane refuses SCTP backends on another port than the service's). */
LBD_INLINE int lb_dnat(struct xdp_md *ctx, struct lb_pkt *pk, const struct lb_backend *be)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	__u32 l4 = pk->p.l4_off & LBD_L4_MASK;
	__u64 diff;
	__be16 port = be->port ? be->port : pk->flow.dport;

	if (pk->p.l3_off > LBD_ETH_HLEN + LBD_VLAN_HLEN || l4 > LBD_MAX_L4_OFF)
		return -1;
	if (pk->p.family == LBD_FAMILY_V4) {
		struct lbd_iphdr *ip = data + (pk->p.l3_off & LBD_L3_MASK);
		__be32 to;

		if ((void *)(ip + 1) > data_end)
			return -1;
		__builtin_memcpy(&to, be->addr, 4);
		diff = lbd_csum_diff4(ip->daddr, to);
		ip->check = lbd_csum_apply(ip->check, diff);
		ip->daddr = to;
	} else {
		struct lbd_ipv6hdr *ip6 = data + (pk->p.l3_off & LBD_L3_MASK);

		if ((void *)(ip6 + 1) > data_end)
			return -1;
		diff = lbd_csum_diff16(ip6->daddr, be->addr);
		__builtin_memcpy(ip6->daddr, be->addr, 16);
	}
	if (pk->p.proto == LBD_IPPROTO_SCTP)
		return 0;
	diff += lbd_csum_diff2(pk->flow.dport, port);
	if (pk->p.proto == LBD_IPPROTO_TCP) {
		struct lbd_tcphdr *tcp = data + l4;

		if ((void *)(tcp + 1) > data_end)
			return -1;
		tcp->check = lbd_csum_apply(tcp->check, diff);
		tcp->dest = port;
	} else {
		struct lbd_udphdr *udp = data + l4;

		if ((void *)(udp + 1) > data_end)
			return -1;
		lbd_csum_apply_udp(&udp->check, diff);
		udp->dest = port;
	}
	return 0;
}

/* One's-complement sum of the inner packet as carried in the outer UDP payload,
 * derived from the inner checksums instead of reading the payload (the trick
 * Linux calls local checksum offload): a transport segment with a valid
 * checksum sums to the complement of its pseudo-header; a valid IPv4 header and
 * an ICMPv4 message sum to zero. Returns -1 when the inner packet carries no
 * checksum to derive from (UDP over IPv4 with checksum 0, SCTP). */
LBD_INLINE __s64 lb_inner_sum(struct xdp_md *ctx, __u32 l3, __u32 l4, __u32 end, __u8 family, __u8 proto)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	__u64 sum = 0, pseudo;
	__u32 l4len = end - l4, off, i;

	/* SCTP's CRC32c is no one's complement sum: nothing to derive from. */
	if (l3 > 256 || l4 > 256 + LBD_MAX_L4_OFF || proto == LBD_IPPROTO_SCTP)
		return -1;
	if (family == LBD_FAMILY_V4) {
		struct lbd_iphdr *ip = data + l3;

		if ((void *)(ip + 1) > data_end)
			return -1;
		if (proto == LBD_IPPROTO_ICMP)
			return 0;
		if (proto == LBD_IPPROTO_UDP) {
			struct lbd_udphdr *udp = data + l4;

			if ((void *)(udp + 1) > data_end || udp->check == 0)
				return -1;
		}
		pseudo = lbd_csum_pseudo4(ip->saddr, ip->daddr, proto, l4len);
		return (__u16)~lbd_csum_fold(pseudo);
	}

	struct lbd_ipv6hdr *ip6 = data + l3;

	if ((void *)(ip6 + 1) > data_end)
		return -1;
	pseudo = lbd_csum_pseudo6(ip6->saddr, ip6->daddr, proto, l4len);
	sum = (__u16)~lbd_csum_fold(pseudo);
	/* The IPv6 header and extension headers carry no checksum: add them. */
	{
		const __u32 *w = (const __u32 *)ip6;

		sum += (__u64)w[0] + w[1] + w[2] + w[3] + w[4] + w[5] + w[6] + w[7] + w[8] + w[9];
	}
	off = l3 + sizeof(*ip6);
	for (i = 0; i < LBD_MAX_L4_OFF / 4; i++) {
		__u32 *w;

		if (off + 4 > l4)
			break;
		if (off > 256 + LBD_MAX_L4_OFF)
			return -1;
		w = data + off;
		if ((void *)(w + 1) > data_end)
			return -1;
		sum += *w;
		off += 4;
	}
	return lbd_csum_fold(sum);
}

/* Put the outer headers in front of the (already DNAT'ed) inner IP packet and
 * choose the verdict. With pass (the next hop is not resolved yet), the
 * encapsulated packet goes to the kernel instead, still addressed to this node's
 * own MAC: its destination is the backend's node, so the kernel resolves the
 * neighbour and forwards it. The original VIP packet must never go up that way:
 * the kernel would route it back to the router, which sends it here again. */
LBD_INLINE int lb_encap(struct xdp_md *ctx, struct lb_pkt *pk, const struct lb_backend *be,
			const struct lb_config *cfg, const struct lb_route *rt, __be16 vport, int pass)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	__u8 vip_family = pk->flow.family;
	__u32 hdr = lb_encap_len(be->node_family, vip_family);
	__u32 l3 = pk->p.l3_off;
	__u32 inner_len = pk->p.ip_end - l3;
	__u32 opt_len = vip_family == LBD_FAMILY_V4 ? sizeof(struct lbd_dsr_opt4) : sizeof(struct lbd_dsr_opt6);
	__u32 udp_len = sizeof(struct lbd_udphdr) + sizeof(struct lbd_genevehdr) + opt_len + LBD_ETH_HLEN + inner_len;
	__u32 frame_len = data_end - data;
	__s64 inner_sum = 0;
	struct lbd_ethhdr *eth, *ieth;
	struct lbd_udphdr *udp;
	struct lbd_genevehdr *gnv;
	struct lbd_geneve_opthdr *opt;
	__be16 inner_proto = vip_family == LBD_FAMILY_V4 ? bpf_htons(LBD_ETH_P_IP) : bpf_htons(LBD_ETH_P_IPV6);
	__u8 dmac[LBD_ETH_ALEN], smac[LBD_ETH_ALEN];
	__u64 sum;

	if (pass) {
		eth = data;
		if ((void *)(eth + 1) > data_end)
			return lb_drop(pk, LB_DROP_INTERNAL);
		__builtin_memcpy(dmac, eth->dst, LBD_ETH_ALEN);
		__builtin_memcpy(smac, eth->src, LBD_ETH_ALEN);
	} else {
		__builtin_memcpy(dmac, rt->dmac, LBD_ETH_ALEN);
		__builtin_memcpy(smac, rt->smac, LBD_ETH_ALEN);
	}

	if (be->node_family == LBD_FAMILY_V6)
		inner_sum = lb_inner_sum(ctx, l3, pk->p.l4_off & LBD_L4_MASK, pk->p.ip_end, vip_family, pk->p.proto);

	/* Ethernet padding would otherwise travel inside the tunnel. */
	if (frame_len > pk->p.ip_end &&
	    bpf_xdp_adjust_tail(ctx, (int)pk->p.ip_end - (int)frame_len))
		return lb_drop(pk, LB_DROP_INTERNAL);
	if (bpf_xdp_adjust_head(ctx, (int)l3 - (int)hdr))
		return lb_drop(pk, LB_DROP_INTERNAL);
	data = (void *)(long)ctx->data;
	data_end = (void *)(long)ctx->data_end;

	eth = data;
	if ((void *)(eth + 1) > data_end)
		return lb_drop(pk, LB_DROP_INTERNAL);
	__builtin_memcpy(eth->dst, dmac, LBD_ETH_ALEN);
	__builtin_memcpy(eth->src, smac, LBD_ETH_ALEN);

	if (be->node_family == LBD_FAMILY_V4) {
		struct lbd_iphdr *ip = (void *)(eth + 1);

		udp = (void *)(ip + 1);
		if ((void *)(udp + 1) > data_end)
			return lb_drop(pk, LB_DROP_INTERNAL);
		__be16 tot_len = bpf_htons(sizeof(*ip) + udp_len), frag_off = bpf_htons(LBD_IP_DF);
		__be32 saddr, daddr;

		eth->proto = bpf_htons(LBD_ETH_P_IP);
		__builtin_memcpy(&saddr, rt->src, 4);
		__builtin_memcpy(&daddr, be->node_addr, 4);
		ip->ver_ihl = 0x45;
		ip->tos = pk->p.tos;
		ip->tot_len = tot_len;
		ip->id = 0;
		ip->frag_off = frag_off;
		ip->ttl = 64;
		ip->protocol = LBD_IPPROTO_UDP;
		ip->saddr = saddr;
		ip->daddr = daddr;
		ip->check = lbd_csum_ipv4_fields(pk->p.tos, tot_len, 0, frag_off, 64, LBD_IPPROTO_UDP, saddr, daddr);
		sum = 0; /* IPv4 underlay: no UDP checksum, like Linux's Geneve default */
	} else {
		struct lbd_ipv6hdr *ip6 = (void *)(eth + 1);

		udp = (void *)(ip6 + 1);
		if ((void *)(udp + 1) > data_end)
			return lb_drop(pk, LB_DROP_INTERNAL);
		eth->proto = bpf_htons(LBD_ETH_P_IPV6);
		/* The flow label spreads tunnelled flows over fabric ECMP like the port:
		 * the hash's low 16 bits, all that a conntrack entry keeps of it. */
		ip6->ver_tc_flow = bpf_htonl((6U << 28) | ((__u32)pk->p.tos << 20) | (pk->hash & 0xffff));
		ip6->payload_len = bpf_htons(udp_len);
		ip6->nexthdr = LBD_IPPROTO_UDP;
		ip6->hop_limit = 64;
		__builtin_memcpy(ip6->saddr, rt->src, 16);
		__builtin_memcpy(ip6->daddr, be->node_addr, 16);
		sum = lbd_csum_pseudo6(ip6->saddr, ip6->daddr, LBD_IPPROTO_UDP, udp_len);
	}

	udp->source = bpf_htons(LBD_SPORT_MIN + ((pk->hash & 0xffff) % LBD_SPORT_RANGE));
	udp->dest = bpf_htons(LBD_GENEVE_PORT);
	udp->len = bpf_htons(udp_len);
	udp->check = 0;

	gnv = (void *)(udp + 1);
	opt = (void *)(gnv + 1);
	if ((void *)(opt + 1) > data_end)
		return lb_drop(pk, LB_DROP_INTERNAL);
	gnv->opt_len_ver = opt_len / 4;
	gnv->flags = LBD_GENEVE_FLAG_CRITICAL;
	gnv->proto = bpf_htons(LBD_GENEVE_PROTO_ETH);
	gnv->vni_rsvd = bpf_htonl(cfg->vni << 8);
	opt->opt_class = bpf_htons(LBD_OPT_CLASS);
	opt->type = LBD_OPT_TYPE;

	if (vip_family == LBD_FAMILY_V4) {
		__u32 *w = (void *)(opt + 1);

		ieth = (void *)(w + 2);
		if ((void *)(ieth + 1) > data_end)
			return lb_drop(pk, LB_DROP_INTERNAL);
		opt->len = LBD_OPT_LEN4_V4;
		__builtin_memcpy(w, pk->flow.daddr, 4);
		w[1] = (__u32)vport; /* port, then two zero bytes */
	} else {
		__u32 *w = (void *)(opt + 1);

		ieth = (void *)(w + 5);
		if ((void *)(ieth + 1) > data_end)
			return lb_drop(pk, LB_DROP_INTERNAL);
		opt->len = LBD_OPT_LEN4_V6;
		__builtin_memcpy(w, pk->flow.daddr, 16);
		w[4] = (__u32)vport;
	}
	/* The inner frame is addressed like the outer one: a decapsulator that keeps
	 * the inner Ethernet header hands the host a frame for itself. */
	__builtin_memcpy(ieth->dst, dmac, LBD_ETH_ALEN);
	__builtin_memcpy(ieth->src, smac, LBD_ETH_ALEN);
	ieth->proto = inner_proto;

	if (be->node_family == LBD_FAMILY_V6) {
		if (inner_sum < 0) {
			/* Zero checksum over IPv6 is allowed for tunnels (RFC 6935) and is the
			 * only choice when the inner packet has none to derive from (UDP without
			 * one, SCTP). */
			udp->check = 0;
		} else {
			const __u32 *w = (const __u32 *)udp;
			const __u16 *e = (const __u16 *)ieth;

			/* UDP + Geneve + option: 28 or 40 bytes, in 4-byte words. */
			sum += (__u64)w[0] + w[1] + w[2] + w[3] + w[4] + w[5] + w[6];
			if (vip_family == LBD_FAMILY_V6)
				sum += (__u64)w[7] + w[8] + w[9];
			sum += (__u32)e[0] + e[1] + e[2] + e[3] + e[4] + e[5] + e[6];
			sum += (__u64)inner_sum;
			udp->check = ~lbd_csum_fold(sum);
			if (!udp->check)
				udp->check = 0xffff;
		}
	}

	if (pass) {
		lb_note(pk, LB_PASS_NO_NEIGH);
		return XDP_PASS;
	}
	if (rt->ifindex == ctx->ingress_ifindex)
		return XDP_TX;
	return bpf_redirect(rt->ifindex, 0);
}

#endif
