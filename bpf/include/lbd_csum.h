/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Internet checksum helpers (RFC 1071, incremental updates per RFC 1624).
 *
 * Every helper works on raw network-order words: the one's-complement sum does
 * not depend on byte order as long as values are read and stored the same way. */
#ifndef LBD_CSUM_H
#define LBD_CSUM_H

#include "lbd_net.h"

/* Fold a 64-bit accumulator of 16/32-bit words into 16 bits (not complemented). */
LBD_INLINE __u16 lbd_csum_fold(__u64 sum)
{
	sum = (sum & 0xffffffff) + (sum >> 32);
	sum = (sum & 0xffffffff) + (sum >> 32);
	sum = (sum & 0xffff) + (sum >> 16);
	sum = (sum & 0xffff) + (sum >> 16);
	return (__u16)sum;
}

/* Sum of a 16-byte address as four 32-bit words. */
LBD_INLINE __u64 lbd_csum_addr6(const __u8 *addr)
{
	const __u32 *w = (const __u32 *)addr;

	return (__u64)w[0] + w[1] + w[2] + w[3];
}

/* Apply a precomputed difference (sum of new words + sum of complemented old
 * words) to a stored checksum field. */
LBD_INLINE __sum16 lbd_csum_apply(__sum16 check, __u64 diff)
{
	return (__sum16)~lbd_csum_fold((__u64)(__u16)~check + diff);
}

/* Difference for replacing a 32-bit word. */
LBD_INLINE __u64 lbd_csum_diff4(__be32 from, __be32 to)
{
	return (__u64)(__u32)~from + to;
}

/* Difference for replacing a 16-bit word. */
LBD_INLINE __u64 lbd_csum_diff2(__be16 from, __be16 to)
{
	return (__u64)(__u16)~from + to;
}

/* Difference for replacing a 16-byte address. */
LBD_INLINE __u64 lbd_csum_diff16(const __u8 *from, const __u8 *to)
{
	const __u32 *f = (const __u32 *)from;
	const __u32 *t = (const __u32 *)to;

	return (__u64)(__u32)~f[0] + (__u32)~f[1] + (__u32)~f[2] + (__u32)~f[3] +
	       t[0] + t[1] + t[2] + t[3];
}

/* UDP over IPv4 may carry no checksum (0); a computed 0 is sent as 0xffff. */
LBD_INLINE void lbd_csum_apply_udp(__sum16 *check, __u64 diff)
{
	__sum16 c;

	if (*check == 0)
		return;
	c = lbd_csum_apply(*check, diff);
	*check = c ? c : (__sum16)0xffff;
}

/* Checksum of a 20-byte IPv4 header without options whose check field is 0. */
LBD_INLINE __sum16 lbd_csum_ipv4_hdr(const void *hdr)
{
	const __u32 *w = hdr;
	__u64 sum = (__u64)w[0] + w[1] + w[2] + w[3] + w[4];

	return (__sum16)~lbd_csum_fold(sum);
}

/* Checksum of a 20-byte IPv4 header without options, from the values of its
 * fields rather than from memory: a header just written field by field cannot be
 * read back as words from the CPU's store buffer, so such a read waits until
 * every older store has reached the cache, a cold conntrack entry's among them.
 * Each argument as it lies in the header; the sum of the 16-bit words as this
 * little-endian target loads them. */
LBD_INLINE __sum16 lbd_csum_ipv4_fields(__u8 tos, __be16 tot_len, __be16 id, __be16 frag_off, __u8 ttl,
					 __u8 proto, __be32 saddr, __be32 daddr)
{
	__u64 sum = (__u64)(0x45 | (__u16)tos << 8) + tot_len + id + frag_off + (__u16)(ttl | (__u16)proto << 8) +
		    saddr + daddr;

	return (__sum16)~lbd_csum_fold(sum);
}

/* Pseudo-header sum for IPv4 TCP/UDP/ICMP-less protocols. */
LBD_INLINE __u64 lbd_csum_pseudo4(__be32 saddr, __be32 daddr, __u8 proto, __u16 len)
{
	return (__u64)saddr + daddr + bpf_htons((__u16)proto) + bpf_htons(len);
}

/* Pseudo-header sum for IPv6 (RFC 8200 §8.1). */
LBD_INLINE __u64 lbd_csum_pseudo6(const __u8 *saddr, const __u8 *daddr, __u8 proto, __u32 len)
{
	return lbd_csum_addr6(saddr) + lbd_csum_addr6(daddr) + bpf_htonl(len) +
	       bpf_htonl((__u32)proto);
}

#endif
