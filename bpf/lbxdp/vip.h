/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Is this packet for a VIP, and may its source use the service? (included by
 * lbxdp.c after its maps). */
#ifndef LBXDP_VIP_H
#define LBXDP_VIP_H

/* Whether the filter allows that the bucket holds a VIP. Without the filter
 * map every address could be one. */
LBD_INLINE int lb_vip_maybe(__u32 bucket)
{
	__u32 zero = 0;
	struct lb_vip_bitmap *f = bpf_map_lookup_elem(&lb_vip_filter, &zero);

	if (!f)
		return 1;
	return f->bits[(bucket >> 3) & (LB_VIP_FILTER_BYTES - 1)] & (1 << (bucket & 7));
}

/* The VIP entry of the packet's destination address, or NULL: not a VIP. */
LBD_INLINE struct lb_vip *lb_vip_get(const struct lb_ct_key *flow)
{
	struct lb_vip_key vk = { .family = flow->family };

	__builtin_memcpy(vk.addr, flow->daddr, 16);
	return bpf_map_lookup_elem(&lb_vips, &vk);
}

/* Whether the client address is in one of the service's allowed source ranges. */
LBD_INLINE int lb_src_allowed(const struct lb_service *svc, const struct lb_ct_key *flow)
{
	struct lb_src_key k = {
		.prefixlen = 64 + (flow->family == LBD_FAMILY_V4 ? 32 : 128),
		.service_id = svc->id,
		.family = flow->family,
	};

	__builtin_memcpy(k.addr, flow->saddr, 16);
	return bpf_map_lookup_elem(&lb_src_ranges, &k) != NULL;
}

#endif
