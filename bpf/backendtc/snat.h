/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Egress: replies of a NAT'ed flow leave with source VIP:port, and ICMP errors about
 * such a flow are rewritten, quoted packet included (included by backendtc.c). */
#ifndef BACKENDTC_SNAT_H
#define BACKENDTC_SNAT_H

/* SNAT of a reply: key holds the addresses and family; ports and proto are read
 * here. ip_off is the IP header, l4_off the TCP/UDP/SCTP header. SCTP's CRC32c
 * covers no address, so only the IP header's checksum changes; its port is the
 * service's already (the control plane refuses anything else), and a reply whose
 * port would have to change is dropped rather than sent with a broken CRC. */
LBD_INLINE int snat(struct __sk_buff *skb, struct nat_key *key, __u32 ip_off,
				__u32 l4_off, __u8 proto)
{
	struct nat_val *v;
	__u8 vip[16];
	__be16 ports[2], vport;
	__u32 csum_off = l4_off + (proto == LBD_IPPROTO_TCP ? offsetof(struct lbd_tcphdr, check) :
							  offsetof(struct lbd_udphdr, check));
	__u8 ctl = 0;
	/* A UDP checksum that computes to 0 is sent as 0xffff (RFC 768): 0 means "none",
	 * which IPv4 allows and IPv6 receivers drop (RFC 8200 §8.1). MARK_MANGLED_0 does
	 * that, and leaves a 0 that came in alone: over IPv4 it is the sender's "none",
	 * over IPv6 only a socket that opted out (UDP_NO_CHECK6_TX, RFC 6935) sends it,
	 * to a receiver that accepts it. TCP has no such rule. */
	__u64 mm = proto == LBD_IPPROTO_UDP ? BPF_F_MARK_MANGLED_0 : 0;

	if (bpf_skb_load_bytes(skb, l4_off, ports, sizeof(ports)) < 0)
		return LBD_TCX_NEXT;
	key->backend_port = ports[0];
	key->client_port = ports[1];
	key->proto = proto;
	v = bpf_map_lookup_elem(&betc_nat, key);
	if (!v)
		return LBD_TCX_NEXT;
	addr_copy(vip, v->vip);
	vport = v->vip_port;

	if (proto == LBD_IPPROTO_SCTP) {
		struct lbd_sctp_chunkhdr ch;

		if (vport != ports[0])
			return drop_out(skb, CNT_DROP_SNAT_FAILED);
		if (key->family == LBD_FAMILY_V4) {
			__be32 from, to;

			__builtin_memcpy(&from, key->backend, 4);
			__builtin_memcpy(&to, vip, 4);
			if (bpf_l3_csum_replace(skb, ip_off + offsetof(struct lbd_iphdr, check), from, to, 4) ||
			    bpf_skb_store_bytes(skb, ip_off + offsetof(struct lbd_iphdr, saddr), &to, 4, 0))
				return drop_out(skb, CNT_DROP_SNAT_FAILED);
		} else if (bpf_skb_store_bytes(skb, ip_off + offsetof(struct lbd_ipv6hdr, saddr), vip, 16, 0)) {
			return drop_out(skb, CNT_DROP_SNAT_FAILED);
		}
		if (bpf_skb_load_bytes(skb, l4_off + sizeof(struct lbd_sctphdr), &ch, sizeof(ch)) == 0)
			ctl = ch.type;
		nat_touch(v, proto, ctl, bpf_ktime_get_boot_ns());
		count(CNT_SNAT_DONE);
		return LBD_TCX_NEXT;
	}

	if (key->family == LBD_FAMILY_V4) {
		__be32 from, to;

		__builtin_memcpy(&from, key->backend, 4);
		__builtin_memcpy(&to, vip, 4);
		if (bpf_l4_csum_replace(skb, csum_off, from, to, BPF_F_PSEUDO_HDR | mm | 4) ||
		    bpf_l4_csum_replace(skb, csum_off, ports[0], vport, mm | 2) ||
		    bpf_l3_csum_replace(skb, ip_off + offsetof(struct lbd_iphdr, check), from, to, 4) ||
		    bpf_skb_store_bytes(skb, ip_off + offsetof(struct lbd_iphdr, saddr), &to, 4, 0))
			return drop_out(skb, CNT_DROP_SNAT_FAILED);
	} else {
		__s64 diff = bpf_csum_diff((__be32 *)key->backend, 16, (__be32 *)vip, 16, 0);

		if (diff < 0 ||
		    bpf_l4_csum_replace(skb, csum_off, 0, diff, BPF_F_PSEUDO_HDR | mm) ||
		    bpf_l4_csum_replace(skb, csum_off, ports[0], vport, mm | 2) ||
		    bpf_skb_store_bytes(skb, ip_off + offsetof(struct lbd_ipv6hdr, saddr), vip, 16, 0))
			return drop_out(skb, CNT_DROP_SNAT_FAILED);
	}
	if (bpf_skb_store_bytes(skb, l4_off, &vport, sizeof(vport), 0))
		return drop_out(skb, CNT_DROP_SNAT_FAILED);
	if (proto == LBD_IPPROTO_TCP && bpf_skb_load_bytes(skb, l4_off + 13, &ctl, 1) < 0)
		ctl = 0;
	nat_touch(v, proto, ctl, bpf_ktime_get_boot_ns());
	count(CNT_SNAT_DONE);
	return LBD_TCX_NEXT;
}

/* The quoted packet of an ICMP error: where it is and the flow it belongs to. */
struct quoted {
	struct nat_key key; /* backend = quoted destination, client = quoted source */
	__u32 ip_off;
	__u32 l4_off;
	__u32 icmp_off;
	__be16 ip_check;    /* IPv4 only */
};

/* Rewrites the quoted packet's destination (backend -> VIP) and its checksums, and
 * keeps the ICMP checksum in step through bpf_l4_csum_replace (no pseudo-header for
 * ICMPv4; ICMPv6's pseudo-header is handled by the caller). Returns 0 on success. */
LBD_INLINE int rewrite_quoted(struct __sk_buff *skb, struct quoted *q,
					  const __u8 *vip, __be16 vport, int v6)
{
	__u32 icsum = q->icmp_off + 2;
	__u32 l4_csum_off = q->l4_off + (q->key.proto == LBD_IPPROTO_TCP ?
					 offsetof(struct lbd_tcphdr, check) :
					 offsetof(struct lbd_udphdr, check));
	__u32 dst_off = q->ip_off + (v6 ? offsetof(struct lbd_ipv6hdr, daddr) :
				     offsetof(struct lbd_iphdr, daddr));
	/* Sum of the address change, as both the quoted L4 and IPv4 checksums see it. */
	__u64 diff = v6 ? lbd_csum_diff16(q->key.backend, vip) :
			  lbd_csum_diff4(*(const __be32 *)q->key.backend, *(const __be32 *)vip);
	__u16 l4_old, l4_new;

	/* The quoted L4 checksum is present when the error quotes enough of the packet
	 * (Linux quotes up to 576/1280 bytes). A UDP checksum that computes to 0 is
	 * written 0xffff, as the client wrote it (RFC 768; RFC 8200 §8.1 for IPv6); a 0
	 * in the quote is the client's own "none" (IPv4, or an IPv6 socket that opted
	 * out) and stays. SCTP's CRC32c covers no address, and its port does not change. */
	if (q->key.proto != LBD_IPPROTO_SCTP && bpf_skb_load_bytes(skb, l4_csum_off, &l4_old, 2) == 0 &&
	    !(q->key.proto == LBD_IPPROTO_UDP && l4_old == 0)) {
		l4_new = lbd_csum_apply(l4_old, diff + lbd_csum_diff2(q->key.backend_port, vport));
		if (q->key.proto == LBD_IPPROTO_UDP && l4_new == 0)
			l4_new = 0xffff;
		if (bpf_skb_store_bytes(skb, l4_csum_off, &l4_new, 2, 0) ||
		    bpf_l4_csum_replace(skb, icsum, l4_old, l4_new, 2))
			return -1;
	}
	if (!v6) {
		__u16 ipc_new = lbd_csum_apply(q->ip_check, diff);
		__be32 from, to;

		__builtin_memcpy(&from, q->key.backend, 4);
		__builtin_memcpy(&to, vip, 4);
		if (bpf_skb_store_bytes(skb, q->ip_off + offsetof(struct lbd_iphdr, check), &ipc_new,
					2, 0) ||
		    bpf_l4_csum_replace(skb, icsum, q->ip_check, ipc_new, 2) ||
		    bpf_l4_csum_replace(skb, icsum, from, to, 4) ||
		    bpf_skb_store_bytes(skb, dst_off, &to, 4, 0))
			return -1;
	} else {
		__s64 d6 = bpf_csum_diff((__be32 *)q->key.backend, 16, (__be32 *)vip, 16, 0);

		if (d6 < 0 || bpf_l4_csum_replace(skb, icsum, 0, d6, 0) ||
		    bpf_skb_store_bytes(skb, dst_off, vip, 16, 0))
			return -1;
	}
	if (bpf_l4_csum_replace(skb, icsum, q->key.backend_port, vport, 2) ||
	    bpf_skb_store_bytes(skb, q->l4_off + 2, &vport, sizeof(vport), 0))
		return -1;
	return 0;
}

LBD_INLINE int quoted_ports(struct __sk_buff *skb, struct quoted *q, __u8 proto)
{
	__be16 ports[2];

	if (proto != LBD_IPPROTO_TCP && proto != LBD_IPPROTO_UDP && proto != LBD_IPPROTO_SCTP)
		return -1;
	if (bpf_skb_load_bytes(skb, q->l4_off, ports, sizeof(ports)) < 0)
		return -1;
	q->key.client_port = ports[0];
	q->key.backend_port = ports[1];
	q->key.proto = proto;
	return 0;
}

/* ICMP errors (destination unreachable incl. fragmentation needed, time exceeded,
 * parameter problem) quoting a packet of a NAT'ed flow, sent by this host to the
 * client: the quote is rewritten to what the client sent (to VIP:port), and the
 * source becomes the VIP when it was the backend address. */
LBD_INLINE int icmp4_error(struct __sk_buff *skb, struct lbd_iphdr *ip, __u32 l4_off)
{
	struct quoted q = {};
	struct lbd_icmphdr ih;
	struct lbd_iphdr eip;
	struct nat_val *v;
	__u8 vip[16];
	__be16 vport;

	if (bpf_skb_load_bytes(skb, l4_off, &ih, sizeof(ih)) < 0)
		return LBD_TCX_NEXT;
	if (ih.type != LBD_ICMP_DEST_UNREACH && ih.type != LBD_ICMP_TIME_EXCEEDED &&
	    ih.type != LBD_ICMP_PARAMETERPROB)
		return LBD_TCX_NEXT;
	q.icmp_off = l4_off;
	q.ip_off = l4_off + sizeof(ih);
	if (bpf_skb_load_bytes(skb, q.ip_off, &eip, sizeof(eip)) < 0)
		return LBD_TCX_NEXT;
	if (lbd_ip4_version(&eip) != 4 || lbd_ip4_hlen(&eip) < sizeof(eip) || (eip.frag_off & bpf_htons(LBD_IP_OFFMASK)) ||
	    eip.saddr != ip->daddr)
		return LBD_TCX_NEXT;
	q.l4_off = q.ip_off + lbd_ip4_hlen(&eip);
	if (quoted_ports(skb, &q, eip.protocol))
		return LBD_TCX_NEXT;
	q.key.family = LBD_FAMILY_V4;
	__builtin_memcpy(q.key.backend, &eip.daddr, 4);
	__builtin_memcpy(q.key.client, &eip.saddr, 4);
	q.ip_check = eip.check;
	v = bpf_map_lookup_elem(&betc_nat, &q.key);
	if (!v)
		return LBD_TCX_NEXT;
	addr_copy(vip, v->vip);
	vport = v->vip_port;

	if (rewrite_quoted(skb, &q, vip, vport, 0))
		return drop_out(skb, CNT_DROP_SNAT_FAILED);
	/* An error from a router function of this node keeps its own source. */
	if (ip->saddr == eip.daddr) {
		__be32 to;

		__builtin_memcpy(&to, vip, 4);
		if (bpf_l3_csum_replace(skb, LBD_ETH_HLEN + offsetof(struct lbd_iphdr, check), ip->saddr,
					to, 4) ||
		    bpf_skb_store_bytes(skb, LBD_ETH_HLEN + offsetof(struct lbd_iphdr, saddr), &to, 4, 0))
			return drop_out(skb, CNT_DROP_SNAT_FAILED);
	}
	count(CNT_ICMP_TRANSLATED);
	return LBD_TCX_NEXT;
}

LBD_INLINE int icmp6_error(struct __sk_buff *skb, struct lbd_ipv6hdr *ip6, __u32 l4_off)
{
	struct quoted q = {};
	struct lbd_icmphdr ih;
	struct lbd_ipv6hdr eip;
	struct nat_val *v;
	__u8 vip[16];
	__be16 vport;

	if (bpf_skb_load_bytes(skb, l4_off, &ih, sizeof(ih)) < 0)
		return LBD_TCX_NEXT;
	if (ih.type != LBD_ICMP6_DEST_UNREACH && ih.type != LBD_ICMP6_PKT_TOOBIG &&
	    ih.type != LBD_ICMP6_TIME_EXCEED && ih.type != LBD_ICMP6_PARAMPROB)
		return LBD_TCX_NEXT;
	q.icmp_off = l4_off;
	q.ip_off = l4_off + sizeof(ih);
	if (bpf_skb_load_bytes(skb, q.ip_off, &eip, sizeof(eip)) < 0)
		return LBD_TCX_NEXT;
	if (lbd_ip6_version(&eip) != 6 || !lbd_addr_eq(eip.saddr, ip6->daddr))
		return LBD_TCX_NEXT;
	q.l4_off = q.ip_off + sizeof(eip);
	if (quoted_ports(skb, &q, eip.nexthdr))
		return LBD_TCX_NEXT;
	q.key.family = LBD_FAMILY_V6;
	__builtin_memcpy(q.key.backend, eip.daddr, 16);
	__builtin_memcpy(q.key.client, eip.saddr, 16);
	v = bpf_map_lookup_elem(&betc_nat, &q.key);
	if (!v)
		return LBD_TCX_NEXT;
	addr_copy(vip, v->vip);
	vport = v->vip_port;

	if (rewrite_quoted(skb, &q, vip, vport, 1))
		return drop_out(skb, CNT_DROP_SNAT_FAILED);
	if (lbd_addr_eq(ip6->saddr, q.key.backend)) {
		/* The source address is part of ICMPv6's pseudo-header. */
		__s64 diff = bpf_csum_diff((__be32 *)q.key.backend, 16, (__be32 *)vip, 16, 0);

		if (diff < 0 ||
		    bpf_l4_csum_replace(skb, q.icmp_off + 2, 0, diff, BPF_F_PSEUDO_HDR) ||
		    bpf_skb_store_bytes(skb, LBD_ETH_HLEN + offsetof(struct lbd_ipv6hdr, saddr), vip, 16, 0))
			return drop_out(skb, CNT_DROP_SNAT_FAILED);
	}
	count(CNT_ICMP_TRANSLATED);
	return LBD_TCX_NEXT;
}

#endif
