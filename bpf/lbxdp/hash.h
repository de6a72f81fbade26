/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Flow hashing of the LB-node program (included by lbxdp.c). Every LB node with the
 * same seed computes the same hash for a flow, so the same Maglev slot: that is what
 * lets a connection survive being moved to another LB node. The Go package mirrors
 * lb_vip_bucket (vipBucket). */
#ifndef LBXDP_HASH_H
#define LBXDP_HASH_H

/* Bucket of a destination address in lb_vip_filter: the XOR of the address's
 * four 32-bit words (as loaded on this little-endian target; an IPv4 address
 * fills the first word, zeros the others) and the family, multiplied by
 * LB_VIP_FILTER_MUL, top LB_VIP_FILTER_ORDER bits. The Go package computes
 * the same (vipBucket). */
LBD_INLINE __u32 lb_vip_bucket(__u32 folded, __u8 family)
{
	return ((folded ^ family) * LB_VIP_FILTER_MUL) >> (32 - LB_VIP_FILTER_ORDER);
}

LBD_INLINE __u32 lb_rotl(__u32 x, int r)
{
	return (x << r) | (x >> (32 - r));
}

/* One round of Murmur3's 32-bit block mix. */
LBD_INLINE __u32 lb_mix(__u32 h, __u32 k)
{
	k *= 0xcc9e2d51;
	k = lb_rotl(k, 15);
	k *= 0x1b873593;
	h ^= k;
	h = lb_rotl(h, 13);
	return h * 5 + 0xe6546b64;
}

LBD_INLINE __u32 lb_fmix(__u32 h)
{
	h ^= h >> 16;
	h *= 0x85ebca6b;
	h ^= h >> 13;
	h *= 0xc2b2ae35;
	h ^= h >> 16;
	return h;
}

/* Flow hash over the whole conntrack key (both addresses, ports, protocol and
 * family): a pure function of the packet and the seed, so every LB node with the
 * same seed computes the same value. */
LBD_INLINE __u32 lb_hash_flow(const struct lb_ct_key *k, __u32 seed)
{
	const __u32 *w = (const __u32 *)k;
	__u32 h = seed;
	int i;

#pragma unroll
	for (i = 0; i < (int)(sizeof(*k) / 4); i++)
		h = lb_mix(h, w[i]);
	return lb_fmix(h ^ sizeof(*k));
}

/* Hash of the client address only, for LB_SVC_HASH_SRC. */
LBD_INLINE __u32 lb_hash_src(const struct lb_ct_key *k, __u32 seed)
{
	const __u32 *w = (const __u32 *)k->saddr;
	__u32 h = seed;

	h = lb_mix(h, w[0]);
	h = lb_mix(h, w[1]);
	h = lb_mix(h, w[2]);
	h = lb_mix(h, w[3]);
	h = lb_mix(h, k->family);
	return lb_fmix(h ^ 20);
}

#endif
