/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Packet parsing shared by the XDP and TC programs. Works on plain data/data_end
 * pointers so that both xdp_md and __sk_buff callers can use it.
 *
 * A parser returns LBD_PARSE_OK, LBD_PARSE_OTHER (well formed but not something
 * lbd handles: hand it to the kernel) or LBD_PARSE_MALFORMED (lengths or fields
 * that no valid packet has: the kernel would drop it too). */
#ifndef LBD_PARSE_H
#define LBD_PARSE_H

#include "lbd_net.h"

#define LBD_PARSE_OK 0
#define LBD_PARSE_OTHER 1
#define LBD_PARSE_MALFORMED (-1)

/* IPv6 extension headers skipped before giving up on finding the transport
 * header, and the largest offset of a transport header that is followed. */
#define LBD_MAX_EXTHDRS 4
#define LBD_MAX_L4_OFF 512

/* Offsets kept in struct lbd_pkt come back from the stack as unknown scalars,
 * and clang may add them to a packet pointer before any range check. Masking
 * keeps them bounded for the verifier; the masks cover every valid value. */
#define LBD_L3_MASK 0x1f
#define LBD_L4_MASK 0x3ff

/* Fragment position of a packet (IPv4 flags/offset or an IPv6 fragment header).
 * An IPv6 "atomic fragment" (offset 0, no more fragments) is whole: RFC 6946. */
#define LBD_FRAG_NONE 0
#define LBD_FRAG_FIRST 1 /* offset 0, more fragments follow: has the L4 header */
#define LBD_FRAG_LATER 2 /* nonzero offset: no L4 header */

struct lbd_pkt {
	__u32 l3_off; /* IP header offset: Ethernet header plus an optional 802.1Q tag */
	__u32 l4_off; /* transport header offset, after IPv4 options / IPv6 ext headers */
	__u32 ip_end; /* offset just past the IP packet; Ethernet padding lies beyond */
	__u8 family;  /* LBD_FAMILY_V4 or LBD_FAMILY_V6 */
	__u8 proto;   /* transport protocol */
	__u8 frag;    /* LBD_FRAG_* */
	__u8 tos;     /* IPv4 TOS or IPv6 traffic class */
};

/* Ethernet and at most one 802.1Q/802.1ad tag. Sets l3_off; returns the
 * ethertype of the payload in *proto. */
LBD_INLINE int lbd_parse_eth(void *data, void *data_end, struct lbd_pkt *p, __be16 *proto)
{
	struct lbd_ethhdr *eth = data;
	struct lbd_vlanhdr *vlan;

	if ((void *)(eth + 1) > data_end)
		return LBD_PARSE_MALFORMED;
	*proto = eth->proto;
	p->l3_off = LBD_ETH_HLEN;
	if (eth->proto == bpf_htons(LBD_ETH_P_8021Q) || eth->proto == bpf_htons(LBD_ETH_P_8021AD)) {
		vlan = (void *)(eth + 1);
		if ((void *)(vlan + 1) > data_end)
			return LBD_PARSE_MALFORMED;
		*proto = vlan->proto;
		p->l3_off = LBD_ETH_HLEN + LBD_VLAN_HLEN;
	}
	return LBD_PARSE_OK;
}

/* IPv4 header at p->l3_off: version, header length, total length against the
 * frame, fragment position. */
LBD_INLINE int lbd_parse_ipv4(void *data, void *data_end, struct lbd_pkt *p)
{
	struct lbd_iphdr *ip;
	__u32 ihl, tot;
	__u16 fo;

	if (p->l3_off > LBD_ETH_HLEN + LBD_VLAN_HLEN)
		return LBD_PARSE_MALFORMED;
	ip = data + (p->l3_off & LBD_L3_MASK);
	if ((void *)(ip + 1) > data_end)
		return LBD_PARSE_MALFORMED;
	if ((ip->ver_ihl >> 4) != 4)
		return LBD_PARSE_MALFORMED;
	ihl = (ip->ver_ihl & 0x0f) * 4;
	tot = bpf_ntohs(ip->tot_len);
	if (ihl < sizeof(*ip) || tot < ihl)
		return LBD_PARSE_MALFORMED;
	if ((void *)ip + tot > data_end)
		return LBD_PARSE_MALFORMED;

	p->family = LBD_FAMILY_V4;
	p->proto = ip->protocol;
	p->tos = ip->tos;
	p->l4_off = p->l3_off + ihl;
	p->ip_end = p->l3_off + tot;
	fo = bpf_ntohs(ip->frag_off);
	if (fo & LBD_IP_OFFMASK)
		p->frag = LBD_FRAG_LATER;
	else if (fo & LBD_IP_MF)
		p->frag = LBD_FRAG_FIRST;
	else
		p->frag = LBD_FRAG_NONE;
	return LBD_PARSE_OK;
}

/* IPv6 header at p->l3_off, then hop-by-hop, routing, destination options, AH and
 * fragment headers up to LBD_MAX_EXTHDRS. A chain that does not end in a
 * transport header within that budget is LBD_PARSE_OTHER. */
LBD_INLINE int lbd_parse_ipv6(void *data, void *data_end, struct lbd_pkt *p)
{
	struct lbd_ipv6hdr *ip6;
	struct lbd_ipv6_opthdr *opt;
	struct lbd_ipv6_fraghdr *fh;
	__u32 off, len;
	__u16 fo;
	__u8 nh;
	int i;

	if (p->l3_off > LBD_ETH_HLEN + LBD_VLAN_HLEN)
		return LBD_PARSE_MALFORMED;
	ip6 = data + (p->l3_off & LBD_L3_MASK);
	if ((void *)(ip6 + 1) > data_end)
		return LBD_PARSE_MALFORMED;
	if ((bpf_ntohl(ip6->ver_tc_flow) >> 28) != 6)
		return LBD_PARSE_MALFORMED;
	len = bpf_ntohs(ip6->payload_len);
	if ((void *)(ip6 + 1) + len > data_end)
		return LBD_PARSE_MALFORMED;

	p->family = LBD_FAMILY_V6;
	p->tos = (bpf_ntohl(ip6->ver_tc_flow) >> 20) & 0xff;
	p->ip_end = p->l3_off + sizeof(*ip6) + len;
	p->frag = LBD_FRAG_NONE;
	off = p->l3_off + sizeof(*ip6);
	nh = ip6->nexthdr;

#pragma unroll
	for (i = 0; i < LBD_MAX_EXTHDRS; i++) {
		switch (nh) {
		case LBD_IPPROTO_HOPOPTS:
		case LBD_IPPROTO_ROUTING:
		case LBD_IPPROTO_DSTOPTS:
		case LBD_IPPROTO_AH:
			opt = data + off;
			if ((void *)(opt + 1) > data_end || off + sizeof(*opt) > p->ip_end)
				return LBD_PARSE_MALFORMED;
			if (nh == LBD_IPPROTO_AH)
				len = ((__u32)opt->hdrlen + 2) * 4;
			else
				len = ((__u32)opt->hdrlen + 1) * 8;
			nh = opt->nexthdr;
			break;
		case LBD_IPPROTO_FRAGMENT:
			fh = data + off;
			if ((void *)(fh + 1) > data_end || off + sizeof(*fh) > p->ip_end)
				return LBD_PARSE_MALFORMED;
			fo = bpf_ntohs(fh->frag_off);
			if (fo & 0xfff8)
				p->frag = LBD_FRAG_LATER;
			else if (fo & 1)
				p->frag = LBD_FRAG_FIRST;
			len = sizeof(*fh);
			nh = fh->nexthdr;
			break;
		default:
			goto done;
		}
		off += len;
		if (off > p->ip_end)
			return LBD_PARSE_MALFORMED;
		if (off > LBD_MAX_L4_OFF)
			return LBD_PARSE_OTHER;
	}
	switch (nh) {
	case LBD_IPPROTO_HOPOPTS:
	case LBD_IPPROTO_ROUTING:
	case LBD_IPPROTO_DSTOPTS:
	case LBD_IPPROTO_AH:
	case LBD_IPPROTO_FRAGMENT:
		return LBD_PARSE_OTHER;
	}
done:
	p->proto = nh;
	p->l4_off = off;
	return LBD_PARSE_OK;
}

/* TCP header at p->l4_off: complete, data offset sane and inside the IP packet. */
LBD_INLINE struct lbd_tcphdr *lbd_parse_tcp(void *data, void *data_end, const struct lbd_pkt *p)
{
	struct lbd_tcphdr *tcp;
	__u32 off = p->l4_off & LBD_L4_MASK, doff;

	if (off > LBD_MAX_L4_OFF)
		return NULL;
	tcp = data + off;
	if ((void *)(tcp + 1) > data_end)
		return NULL;
	doff = (tcp->doff_res >> 4) * 4;
	if (doff < sizeof(*tcp) || off + doff > p->ip_end)
		return NULL;
	return tcp;
}

/* UDP header at p->l4_off: complete, length field within the IP packet. */
LBD_INLINE struct lbd_udphdr *lbd_parse_udp(void *data, void *data_end, const struct lbd_pkt *p)
{
	struct lbd_udphdr *udp;
	__u32 off = p->l4_off & LBD_L4_MASK, len;

	if (off > LBD_MAX_L4_OFF)
		return NULL;
	udp = data + off;
	if ((void *)(udp + 1) > data_end)
		return NULL;
	len = bpf_ntohs(udp->len);
	if (len < sizeof(*udp) || off + len > p->ip_end)
		return NULL;
	return udp;
}

/* SCTP common header at p->l4_off and the header of its first chunk: both complete,
 * the chunk's length at least its header and inside the IP packet. A packet without
 * a chunk is no valid SCTP packet (RFC 9260 §3). */
LBD_INLINE struct lbd_sctphdr *lbd_parse_sctp(void *data, void *data_end, const struct lbd_pkt *p,
					      struct lbd_sctp_chunkhdr **chunk)
{
	struct lbd_sctphdr *sh;
	struct lbd_sctp_chunkhdr *ch;
	__u32 off = p->l4_off & LBD_L4_MASK, len;

	if (off > LBD_MAX_L4_OFF)
		return NULL;
	sh = data + off;
	ch = (void *)(sh + 1);
	if ((void *)(ch + 1) > data_end)
		return NULL;
	len = bpf_ntohs(ch->len);
	if (len < sizeof(*ch) || off + sizeof(*sh) + len > p->ip_end)
		return NULL;
	*chunk = ch;
	return sh;
}

#endif
