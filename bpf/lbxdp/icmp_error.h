/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* ICMP errors that routers send to a VIP about a backend's DSR reply, forwarded to
 * the backend of that flow (included by lbxdp.c after its maps). */
#ifndef LBXDP_ICMP_ERROR_H
#define LBXDP_ICMP_ERROR_H

/* An ICMP error sent to a VIP about a packet the VIP sent (a backend's DSR reply):
 * forward it to the flow's backend, translated so that the backend's stack
 * recognises its own packet (RFC 5508 §4.2): outer destination and the embedded
 * source become the backend's address and port. The embedded transport checksum
 * is left as is; receivers do not verify it. */
LBD_INLINE int lb_icmp_error(struct xdp_md *ctx, struct lb_pkt *pk)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	__u32 l4 = pk->p.l4_off & LBD_L4_MASK, be_id;
	struct lb_service_key sk = {};
	struct lbd_icmphdr *icmp;
	struct lb_service *svc;
	struct lb_backend *be;
	struct lb_config *cfg;
	struct lb_ct *ct;
	struct lb_route *rt;
	__be16 *eports, vport, bport;
	struct lb_vip *vip;
	__u64 diff;
	__u32 hdr;
	int r;

	vip = lb_vip_get(&pk->flow);
	if (!vip)
		return XDP_PASS;
	/* From here on the packet is for a VIP: whatever lbd does not forward is dropped,
	 * never handed to the kernel, which would route it back to the router. */
	if (l4 > LBD_MAX_L4_OFF)
		return lb_drop(pk, LB_DROP_MALFORMED);
	icmp = data + l4;
	if ((void *)(icmp + 1) > data_end)
		return lb_drop(pk, LB_DROP_MALFORMED);
	if (pk->p.family == LBD_FAMILY_V4) {
		if (icmp->type != LBD_ICMP_DEST_UNREACH && icmp->type != LBD_ICMP_TIME_EXCEEDED &&
		    icmp->type != LBD_ICMP_PARAMETERPROB)
			return lb_drop(pk, LB_DROP_NO_SERVICE);
	} else {
		/* Neighbour discovery is the kernel's whatever its target: it never leaves
		 * the link (hop limit 255), so it cannot loop. */
		if (icmp->type >= LBD_ICMP6_ND_FIRST && icmp->type <= LBD_ICMP6_ND_LAST)
			return XDP_PASS;
		if (icmp->type < LBD_ICMP6_DEST_UNREACH || icmp->type > LBD_ICMP6_PARAMPROB)
			return lb_drop(pk, LB_DROP_NO_SERVICE);
	}

	/* The embedded packet went VIP:port -> client:port. */
	if (pk->p.family == LBD_FAMILY_V4) {
		struct lbd_iphdr *eip = (void *)(icmp + 1);
		__u32 eihl;

		if ((void *)(eip + 1) > data_end)
			return lb_drop(pk, LB_DROP_MALFORMED);
		eihl = (eip->ver_ihl & 0x0f) * 4;
		if ((eip->ver_ihl >> 4) != 4 || eihl < sizeof(*eip))
			return lb_drop(pk, LB_DROP_MALFORMED);
		eports = (void *)eip + eihl;
		if ((void *)(eports + 2) > data_end || (void *)(eports + 2) > data + pk->p.ip_end)
			return lb_drop(pk, LB_DROP_MALFORMED);
		if (eip->saddr != *(__be32 *)pk->flow.daddr)
			return lb_drop(pk, LB_DROP_NO_SERVICE);
		sk.proto = eip->protocol;
		__builtin_memcpy(pk->flow.saddr, &eip->daddr, 4);
	} else {
		struct lbd_ipv6hdr *eip6 = (void *)(icmp + 1);

		eports = (void *)(eip6 + 1);
		if ((void *)(eports + 2) > data_end || (void *)(eports + 2) > data + pk->p.ip_end)
			return lb_drop(pk, LB_DROP_MALFORMED);
		if (!lbd_addr_eq(eip6->saddr, pk->flow.daddr))
			return lb_drop(pk, LB_DROP_NO_SERVICE);
		sk.proto = eip6->nexthdr;
		__builtin_memcpy(pk->flow.saddr, eip6->daddr, 16);
	}
	if (sk.proto != LBD_IPPROTO_TCP && sk.proto != LBD_IPPROTO_UDP && sk.proto != LBD_IPPROTO_SCTP)
		return lb_drop(pk, LB_DROP_NO_SERVICE);
	vport = eports[0];
	__builtin_memcpy(sk.addr, pk->flow.daddr, 16);
	sk.port = vport;
	sk.family = pk->flow.family;
	svc = lb_service_get(&sk, vip);
	if (!svc)
		return lb_drop(pk, LB_DROP_NO_SERVICE);

	/* The client's address must be allowed, as for its own packets. */
	if ((svc->flags & LB_SVC_SRC_RANGES) && !lb_src_allowed(svc, &pk->flow))
		return lb_drop(pk, LB_DROP_SRC_RANGE);

	/* Rebuild the client's flow to find its backend, as a client packet would. */
	pk->flow.sport = eports[1];
	pk->flow.dport = vport;
	pk->flow.proto = sk.proto;
	cfg = lb_config_get();
	if (!cfg)
		return lb_drop(pk, LB_DROP_INTERNAL);
	pk->hash = lb_hash_flow(&pk->flow, cfg->hash_seed);
	be = NULL;
	ct = lb_ct_lookup(pk);
	if (ct)
		be = lb_backend_get(ct->backend_id);
	if (!be) {
		be_id = lb_maglev_pick(svc, (svc->flags & LB_SVC_HASH_SRC) ?
						   lb_hash_src(&pk->flow, cfg->hash_seed) : pk->hash);
		be = lb_backend_get(be_id);
	} else {
		be_id = ct->backend_id;
	}
	if (!be || be->family != pk->flow.family)
		return lb_drop(pk, LB_DROP_NO_BACKEND);

	hdr = lb_encap_len(be->node_family, pk->flow.family);
	r = lb_route(ctx, pk, be_id, be, cfg, lb_now(), hdr - LBD_ETH_HLEN + pk->ip_len, &rt);
	if (r == LB_ROUTE_TOO_BIG)
		return lb_drop(pk, LB_DROP_TOO_BIG_UNSIGNALED);
	if (r != LB_ROUTE_OK && r != LB_ROUTE_NO_NEIGH)
		return lb_route_drop(pk, r);

	/* Translate. eports/icmp still point into the unmodified packet. */
	bport = be->port ? be->port : vport;
	if (pk->p.family == LBD_FAMILY_V4) {
		struct lbd_iphdr *ip = data + (pk->p.l3_off & LBD_L3_MASK);
		struct lbd_iphdr *eip = (void *)(icmp + 1);
		__be32 to;
		__sum16 old;

		if (pk->p.l3_off > LBD_ETH_HLEN + LBD_VLAN_HLEN || (void *)(ip + 1) > data_end ||
		    (void *)(eip + 1) > data_end)
			return lb_drop(pk, LB_DROP_INTERNAL);
		__builtin_memcpy(&to, be->addr, 4);
		ip->check = lbd_csum_apply(ip->check, lbd_csum_diff4(ip->daddr, to));
		ip->daddr = to;
		diff = lbd_csum_diff4(eip->saddr, to);
		old = eip->check;
		eip->check = lbd_csum_apply(eip->check, diff);
		eip->saddr = to;
		diff += lbd_csum_diff2(old, eip->check) + lbd_csum_diff2(vport, bport);
	} else {
		struct lbd_ipv6hdr *ip6 = data + (pk->p.l3_off & LBD_L3_MASK);
		struct lbd_ipv6hdr *eip6 = (void *)(icmp + 1);

		if (pk->p.l3_off > LBD_ETH_HLEN + LBD_VLAN_HLEN || (void *)(ip6 + 1) > data_end ||
		    (void *)(eip6 + 1) > data_end)
			return lb_drop(pk, LB_DROP_INTERNAL);
		/* ICMPv6 covers a pseudo-header with the outer destination. */
		diff = lbd_csum_diff16(ip6->daddr, be->addr) + lbd_csum_diff16(eip6->saddr, be->addr) +
		       lbd_csum_diff2(vport, bport);
		__builtin_memcpy(ip6->daddr, be->addr, 16);
		__builtin_memcpy(eip6->saddr, be->addr, 16);
	}
	if ((void *)(eports + 2) > data_end)
		return lb_drop(pk, LB_DROP_INTERNAL);
	eports[0] = bport;
	icmp->check = lbd_csum_apply(icmp->check, diff);

	if (!pk->trace) {
		lb_count(&lb_svc_stats, svc->id, pk->ip_len, 0);
		lb_count(&lb_be_stats, be_id, pk->ip_len, 0);
	}
	return lb_encap(ctx, pk, be, cfg, rt, vport, r == LB_ROUTE_NO_NEIGH);
}

#endif
