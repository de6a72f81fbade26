/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* The lifetime of a NAT entry, which both directions refresh (included by
 * backendtc.c). */
#ifndef BACKENDTC_NAT_H
#define BACKENDTC_NAT_H

/* A 16-byte address copied in words: the stack copies it lands in are read in
 * words too. */
LBD_INLINE void addr_copy(__u8 *dst, const __u8 *src)
{
	__u32 *d = (__u32 *)dst;
	const __u32 *s = (const __u32 *)src;

	d[0] = s[0];
	d[1] = s[1];
	d[2] = s[2];
	d[3] = s[3];
}

/* Updates last_seen (throttled) and the closing flag of an entry in place. A SYN
 * without ACK starts a new connection on a reused tuple, so it reopens the entry. */
LBD_INLINE void nat_touch(struct nat_val *v, __u8 proto, __u8 tcp_flags, __u64 now)
{
	__u8 flags = v->flags;

	if (proto == LBD_IPPROTO_TCP) {
		if ((tcp_flags & (LBD_TCP_SYN | LBD_TCP_ACK)) == LBD_TCP_SYN)
			flags &= ~LBD_NAT_F_CLOSING;
		if (tcp_flags & (LBD_TCP_FIN | LBD_TCP_RST))
			flags |= LBD_NAT_F_CLOSING;
	}
	if (flags != v->flags) {
		if (flags & LBD_NAT_F_CLOSING)
			count(CNT_NAT_CLOSING);
		v->flags = flags;
		v->last_seen = now;
	} else if (now - v->last_seen >= LBD_NAT_TOUCH_NS) {
		v->last_seen = now;
	}
}

#endif
