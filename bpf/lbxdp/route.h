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

#define LB_ROUTE_OK 0
#define LB_ROUTE_TOO_BIG 1
#define LB_ROUTE_FAIL 2

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
 * a length exceeds it), one without length for next hop and source. */
LBD_INLINE int lb_fib_resolve(struct xdp_md *ctx, const struct lb_backend *be, const struct lb_config *cfg,
			      __u64 now, struct lb_route *c)
{
	struct bpf_fib_lookup fib;
	__u32 flags, mtu = 0xffff;
	long rc;

	lb_fib_params(ctx, be, cfg, &fib, &flags);
	fib.tot_len = 0xffff;
	rc = bpf_fib_lookup(ctx, &fib, sizeof(fib), 0);
	if (rc == BPF_FIB_LKUP_RET_FRAG_NEEDED)
		mtu = fib.mtu_result;
	else if (rc != BPF_FIB_LKUP_RET_SUCCESS)
		return -1;
	lb_fib_params(ctx, be, cfg, &fib, &flags);
	rc = bpf_fib_lookup(ctx, &fib, sizeof(fib), flags);
	if (rc != BPF_FIB_LKUP_RET_SUCCESS)
		return -1;
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
	c->expires_ns = now + LB_FIB_CACHE_NS;
	return 0;
}

/* Route toward the backend's node, from the cache or the FIB. outer_len is the
 * outer IP packet length, checked against the route MTU. */
LBD_INLINE int lb_route(struct xdp_md *ctx, __u32 be_id, const struct lb_backend *be,
			const struct lb_config *cfg, __u64 now, __u32 outer_len, struct lb_route **rtp)
{
	struct lb_route *c = bpf_map_lookup_elem(&lb_fib_cache, &be_id);

	if (!c)
		return LB_ROUTE_FAIL;
	if (now >= c->expires_ns || c->ingress != ctx->ingress_ifindex || c->gen != cfg->route_gen ||
	    !lbd_addr_eq(c->node, be->node_addr)) {
		c->expires_ns = 0;
		if (lb_fib_resolve(ctx, be, cfg, now, c))
			return LB_ROUTE_FAIL;
	}
	*rtp = c;
	if (outer_len > c->mtu)
		return LB_ROUTE_TOO_BIG;
	return LB_ROUTE_OK;
}

#endif
