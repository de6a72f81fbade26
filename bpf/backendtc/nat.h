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

/* Whether a packet opens a connection (a TCP SYN without ACK, an SCTP INIT) or
 * closes it (a TCP FIN or RST; an SCTP ABORT, SHUTDOWN or SHUTDOWN COMPLETE). ctl is
 * the TCP flags, or the type of an SCTP packet's first chunk. */
LBD_INLINE int nat_opens(__u8 proto, __u8 ctl)
{
	if (proto == LBD_IPPROTO_SCTP)
		return ctl == LBD_SCTP_INIT;
	return proto == LBD_IPPROTO_TCP && (ctl & (LBD_TCP_SYN | LBD_TCP_ACK)) == LBD_TCP_SYN;
}

LBD_INLINE int nat_closes(__u8 proto, __u8 ctl)
{
	if (proto == LBD_IPPROTO_SCTP)
		return ctl == LBD_SCTP_ABORT || ctl == LBD_SCTP_SHUTDOWN || ctl == LBD_SCTP_SHUTDOWN_COMPLETE;
	return proto == LBD_IPPROTO_TCP && (ctl & (LBD_TCP_FIN | LBD_TCP_RST));
}

/* Updates last_seen (throttled) and the closing flag of an entry in place. A SYN
 * without ACK (an INIT) starts a new connection on a reused tuple, so it reopens the
 * entry. */
LBD_INLINE void nat_touch(struct nat_val *v, __u8 proto, __u8 ctl, __u64 now)
{
	__u8 flags = v->flags;

	if (nat_opens(proto, ctl))
		flags &= ~LBD_NAT_F_CLOSING;
	if (nat_closes(proto, ctl))
		flags |= LBD_NAT_F_CLOSING;
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
