/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Incremental Internet checksum updates (RFC 1624) for checksums that are plain data
 * to the kernel: those inside the packet an ICMP error quotes. The skb's own checksums
 * go through bpf_l3/l4_csum_replace, which know about CHECKSUM_PARTIAL. All values are
 * 16-bit words in network order, as read from the packet. */
#ifndef LBD_BACKENDTC_CSUM_H
#define LBD_BACKENDTC_CSUM_H

#include <linux/types.h>

static __always_inline __u16 csum_fold32(__u32 s)
{
	s = (s & 0xffff) + (s >> 16);
	s = (s & 0xffff) + (s >> 16);
	return (__u16)s;
}

/* HC' = ~(~HC + ~m + m') for a field of n 16-bit words changing from "from" to "to". */
static __always_inline __u16 csum_replace_words(__u16 hc, const __u16 *from, const __u16 *to,
						int n)
{
	__u32 s = (__u16)~hc;
	int i;

#pragma unroll
	for (i = 0; i < 8; i++) {
		if (i >= n)
			break;
		s += (__u16)~from[i];
		s += to[i];
	}
	return (__u16)~csum_fold32(s);
}

static __always_inline __u16 csum_replace2(__u16 hc, __u16 from, __u16 to)
{
	return csum_replace_words(hc, &from, &to, 1);
}

#endif
