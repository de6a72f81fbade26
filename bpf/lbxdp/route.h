/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* The route toward a backend's node (included by lbxdp.c after its maps):
 * bpf_fib_lookup for next hop, outer source and route MTU, cached per CPU and
 * backend in lb_fib_cache (struct lb_route). */
#ifndef LBXDP_ROUTE_H
#define LBXDP_ROUTE_H

/* bpf_fib_lookup takes AF_* families, not lbd's LBD_FAMILY_*. */
#define LBD_AF_INET 2
#define LBD_AF_INET6 10

/* How long a cached route is used before the FIB is asked again. */
#define LB_FIB_CACHE_NS (LBD_NSEC_PER_SEC / 2)

/* Outcomes of lb_route. */
#define LB_ROUTE_OK 0
#define LB_ROUTE_TOO_BIG 1
#define LB_ROUTE_NO_NEIGH 2 /* route known, next hop not resolved: hand the packet to the kernel */
#define LB_ROUTE_NO_ROUTE 3 /* no route, or a blackhole, unreachable or prohibit route */
#define LB_ROUTE_FAIL 4     /* any other FIB failure (forwarding off on the ingress device, ...) */

LBD_INLINE int lb_route_code(long rc)
{
	switch (rc) {
	case BPF_FIB_LKUP_RET_NOT_FWDED:
	case BPF_FIB_LKUP_RET_BLACKHOLE:
	case BPF_FIB_LKUP_RET_UNREACHABLE:
	case BPF_FIB_LKUP_RET_PROHIBIT:
		return LB_ROUTE_NO_ROUTE;
	case BPF_FIB_LKUP_RET_NO_NEIGH:
		return LB_ROUTE_NO_NEIGH;
	}
	return LB_ROUTE_FAIL;
}

LBD_INLINE void lb_fib_params(struct xdp_md *ctx, const struct lb_backend *be, const struct lb_config *cfg,
				 struct bpf_fib_lookup *fib, __u32 *flags)
{
	__builtin_memset(fib, 0, sizeof(*fib));
	*flags = 0;
	fib->ifindex = ctx->ingress_ifindex;
	fib->l4_protocol = LBD_IPPROTO_UDP;
	if (be->node_family == LBD_FAMILY_V4) {
		fib->family = LBD_AF_INET;
		__builtin_memcpy(&fib->ipv4_dst, be->node_addr, 4);
		__builtin_memcpy(&fib->ipv4_src, cfg->src4, 4);
		if (!fib->ipv4_src)
			*flags = BPF_FIB_LOOKUP_SRC;
	} else {
		fib->family = LBD_AF_INET6;
		__builtin_memcpy(fib->ipv6_dst, be->node_addr, 16);
		__builtin_memcpy(fib->ipv6_src, cfg->src6, 16);
		if (!(fib->ipv6_src[0] | fib->ipv6_src[1] | fib->ipv6_src[2] | fib->ipv6_src[3]))
			*flags = BPF_FIB_LOOKUP_SRC;
	}
}

/* Resolve the route toward the backend's node into a cache entry: one lookup
 * with the largest length to learn the route MTU (the FIB reports it only when
 * a length exceeds it), one without length for next hop and source. An
 * unresolved next hop (BPF_FIB_LKUP_RET_NO_NEIGH, the normal state of a
 * freshly booted host) still fills egress, source and MTU, but is not cached:
 * the next packet asks again. *fib_rc keeps the last lookup's result for traces. */
LBD_INLINE int lb_fib_resolve(struct xdp_md *ctx, const struct lb_backend *be, const struct lb_config *cfg,
			      __u64 now, struct lb_route *c, __u8 *fib_rc)
{
	struct bpf_fib_lookup fib;
	__u32 flags, mtu = 0xffff;
	int r = LB_ROUTE_OK;
	long rc;

	lb_fib_params(ctx, be, cfg, &fib, &flags);
	fib.tot_len = 0xffff;
	rc = bpf_fib_lookup(ctx, &fib, sizeof(fib), 0);
	*fib_rc = rc;
	if (rc == BPF_FIB_LKUP_RET_FRAG_NEEDED)
		mtu = fib.mtu_result;
	else if (rc != BPF_FIB_LKUP_RET_SUCCESS && rc != BPF_FIB_LKUP_RET_NO_NEIGH)
		return lb_route_code(rc);
	lb_fib_params(ctx, be, cfg, &fib, &flags);
	rc = bpf_fib_lookup(ctx, &fib, sizeof(fib), flags);
	*fib_rc = rc;
	if (rc != BPF_FIB_LKUP_RET_SUCCESS) {
		r = lb_route_code(rc);
		if (r != LB_ROUTE_NO_NEIGH)
			return r;
	}
	__builtin_memcpy(c->node, be->node_addr, 16);
	c->ingress = ctx->ingress_ifindex;
	c->ifindex = fib.ifindex;
	c->mtu = mtu;
	__builtin_memcpy(c->smac, fib.smac, LBD_ETH_ALEN);
	__builtin_memcpy(c->dmac, fib.dmac, LBD_ETH_ALEN);
	__builtin_memset(c->src, 0, 16);
	if (be->node_family == LBD_FAMILY_V4)
		__builtin_memcpy(c->src, &fib.ipv4_src, 4);
	else
		__builtin_memcpy(c->src, fib.ipv6_src, 16);
	c->gen = cfg->route_gen;
	c->expires_ns = r == LB_ROUTE_OK ? now + LB_FIB_CACHE_NS : 0;
	return r;
}

/* Route toward the backend's node, from the cache or the FIB. outer_len is the
 * outer IP packet length, checked against the route MTU. *rtp is set for
 * LB_ROUTE_OK, LB_ROUTE_TOO_BIG and LB_ROUTE_NO_NEIGH (which has no MACs). */
LBD_INLINE int lb_route(struct xdp_md *ctx, struct lb_pkt *pk, __u32 be_id, const struct lb_backend *be,
			const struct lb_config *cfg, __u64 now, __u32 outer_len, struct lb_route **rtp)
{
	struct lb_route *c = bpf_map_lookup_elem(&lb_fib_cache, &be_id);
	int r = LB_ROUTE_OK;

	if (!c)
		return LB_ROUTE_FAIL;
	if (now >= c->expires_ns || c->ingress != ctx->ingress_ifindex || c->gen != cfg->route_gen ||
	    !lbd_addr_eq(c->node, be->node_addr)) {
		c->expires_ns = 0;
		r = lb_fib_resolve(ctx, be, cfg, now, c, &pk->fib_rc);
		pk->fib_done = 1;
		if (r != LB_ROUTE_OK && r != LB_ROUTE_NO_NEIGH)
			return r;
	}
	*rtp = c;
	if (outer_len > c->mtu)
		return LB_ROUTE_TOO_BIG;
	return r;
}

/* Drop a packet whose route failed (not OK, TOO_BIG or NO_NEIGH), counted by why. */
LBD_INLINE int lb_route_drop(struct lb_pkt *pk, int r)
{
	return lb_drop(pk, r == LB_ROUTE_NO_ROUTE ? LB_DROP_FIB_NO_ROUTE : LB_DROP_FIB);
}

#endif
