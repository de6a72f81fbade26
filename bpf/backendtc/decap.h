/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Ingress: lbd's Geneve packets from an allowed LB source are checked, stripped to
 * the inner packet, and recorded as NAT entries; other Geneve is told apart and left
 * alone (included by backendtc.c). */
#ifndef BACKENDTC_DECAP_H
#define BACKENDTC_DECAP_H

/* Results of parse_dsr_opt besides a drop reason: the DSR option was found and is
 * well-formed, or the packet is not lbd's. Neither is a drop counter. */
#define OPT_OK CNT_MAX
#define OPT_FOREIGN CNT_PASS_FOREIGN

/* Walks the Geneve options at opts_off (opt_len bytes) and fills val with the DSR
 * option's VIP and port.
 *
 * The packet is lbd's when the walk meets lbd's option (class and type); without it
 * the packet belongs to another tunnel on the same port and OPT_FOREIGN says to leave
 * it alone, whatever else its options hold: critical ones are its receiver's
 * business, and an option area that cannot be walked to the end (an option overrunning
 * it, more options than we walk) cannot show that the packet is ours. Once lbd's
 * option header is seen the packet is ours, so any fault is a drop reason: the option
 * itself malformed (length, padding, overrunning the area) or repeated, the rest of
 * the area unwalkable (a critical option could hide there), or a critical option of
 * another class, which lbd cannot honour. Returns OPT_OK, OPT_FOREIGN or the drop
 * reason. */
LBD_INLINE __u32 parse_dsr_opt(struct __sk_buff *skb, __u32 opts_off, __u32 opt_len,
					   struct nat_val *val)
{
	__u32 pos = 0;
	int found = 0, critical = 0;
	int i;

	for (i = 0; i < LBD_MAX_GENEVE_OPTS; i++) {
		struct lbd_geneve_opthdr oh;
		__u32 olen;

		if (pos >= opt_len)
			break;
		if (pos + sizeof(oh) > opt_len ||
		    bpf_skb_load_bytes(skb, opts_off + pos, &oh, sizeof(oh)) < 0)
			goto unwalkable;
		olen = (oh.len & 0x1f) * 4;
		if (oh.opt_class == bpf_htons(LBD_OPT_CLASS) && oh.type == LBD_OPT_TYPE) {
			/* lbd's option: the packet is ours from here on. */
			if (found || pos + sizeof(oh) + olen > opt_len)
				return CNT_DROP_MALFORMED_OPT;
			if (olen == LBD_OPT_LEN4_V4 * 4) {
				struct lbd_dsr_opt4 o;

				if (bpf_skb_load_bytes(skb, opts_off + pos, &o, sizeof(o)) < 0)
					return CNT_DROP_BAD_LEN;
				if (o.pad)
					return CNT_DROP_MALFORMED_OPT;
				__builtin_memcpy(val->vip, &o.vip, 4);
				val->vip_port = o.port;
				val->family = LBD_FAMILY_V4;
			} else if (olen == LBD_OPT_LEN4_V6 * 4) {
				struct lbd_dsr_opt6 o;

				if (bpf_skb_load_bytes(skb, opts_off + pos, &o, sizeof(o)) < 0)
					return CNT_DROP_BAD_LEN;
				if (o.pad)
					return CNT_DROP_MALFORMED_OPT;
				__builtin_memcpy(val->vip, o.vip, 16);
				val->vip_port = o.port;
				val->family = LBD_FAMILY_V6;
			} else {
				return CNT_DROP_MALFORMED_OPT;
			}
			found = 1;
		} else if (pos + sizeof(oh) + olen > opt_len) {
			goto unwalkable;
		} else {
			/* Or'ed in rather than branched on: a branch would split the
			 * verifier's states at every option walked. */
			critical |= oh.type & LBD_OPT_CRITICAL;
		}
		pos += sizeof(oh) + olen;
	}
	if (pos < opt_len)
		goto unwalkable; /* more options than we walk */
	if (!found)
		return OPT_FOREIGN;
	if (critical)
		return CNT_DROP_UNKNOWN_CRITICAL;
	return OPT_OK;
unwalkable:
	return found ? CNT_DROP_MALFORMED_OPT : OPT_FOREIGN;
}

/* Parsed inner packet: where its IP header starts and the NAT entry it asks for. */
struct inner {
	struct nat_key key;
	struct nat_val val;
	__u32 ip_off;
	__be16 eth_proto;
	__u8 ctl;       /* TCP flags, or the type of an SCTP packet's first chunk */
	__u8 has_ports;
};

/* Reads the L4 ports (and TCP flags, SCTP's first chunk type) of the inner packet
 * into in->key. Returns 0, or
 * the drop reason when the L4 header does not fit in the IP payload. */
LBD_INLINE __u32 inner_ports(struct __sk_buff *skb, struct inner *in, __u32 l4_off,
					 __u32 l4_len, __u8 proto)
{
	if (proto == LBD_IPPROTO_TCP) {
		struct lbd_tcphdr th;

		if (l4_len < sizeof(th))
			return CNT_DROP_BAD_LEN;
		if (bpf_skb_load_bytes(skb, l4_off, &th, sizeof(th)) < 0)
			return CNT_DROP_BAD_LEN;
		in->key.client_port = th.source;
		in->key.backend_port = th.dest;
		in->ctl = th.flags;
	} else if (proto == LBD_IPPROTO_UDP) {
		struct lbd_udphdr uh;

		if (l4_len < sizeof(uh))
			return CNT_DROP_BAD_LEN;
		if (bpf_skb_load_bytes(skb, l4_off, &uh, sizeof(uh)) < 0)
			return CNT_DROP_BAD_LEN;
		in->key.client_port = uh.source;
		in->key.backend_port = uh.dest;
	} else if (proto == LBD_IPPROTO_SCTP) {
		struct {
			struct lbd_sctphdr h;
			struct lbd_sctp_chunkhdr c;
		} sh;

		if (l4_len < sizeof(sh))
			return CNT_DROP_BAD_LEN;
		if (bpf_skb_load_bytes(skb, l4_off, &sh, sizeof(sh)) < 0)
			return CNT_DROP_BAD_LEN;
		in->key.client_port = sh.h.source;
		in->key.backend_port = sh.h.dest;
		in->ctl = sh.c.type;
	} else {
		return 0;
	}
	in->key.proto = proto;
	in->has_ports = 1;
	return 0;
}

/* Parses the inner IP packet at in->ip_off, inner_len bytes long (Ethernet padding
 * included). Returns 0 or the drop reason. */
LBD_INLINE __u32 parse_inner(struct __sk_buff *skb, struct inner *in, __u32 inner_len)
{
	if (in->val.family == LBD_FAMILY_V4) {
		struct lbd_iphdr ip;
		__u32 hl, tot;

		if (in->eth_proto != bpf_htons(LBD_ETH_P_IP))
			return CNT_DROP_BAD_INNER;
		if (inner_len < sizeof(ip))
			return CNT_DROP_BAD_LEN;
		if (bpf_skb_load_bytes(skb, in->ip_off, &ip, sizeof(ip)) < 0)
			return CNT_DROP_BAD_LEN;
		if (lbd_ip4_version(&ip) != 4 || lbd_ip4_hlen(&ip) < sizeof(ip))
			return CNT_DROP_BAD_INNER;
		hl = lbd_ip4_hlen(&ip);
		tot = bpf_ntohs(ip.tot_len);
		if (tot < hl || tot > inner_len)
			return CNT_DROP_BAD_LEN;
		in->key.family = LBD_FAMILY_V4;
		__builtin_memcpy(in->key.client, &ip.saddr, 4);
		__builtin_memcpy(in->key.backend, &ip.daddr, 4);
		/* Later fragments carry no ports: decapsulated, but they make no entry. */
		if (ip.frag_off & bpf_htons(LBD_IP_OFFMASK))
			return 0;
		return inner_ports(skb, in, in->ip_off + hl, tot - hl, ip.protocol);
	} else {
		struct lbd_ipv6hdr ip6;
		__u32 plen;

		if (in->eth_proto != bpf_htons(LBD_ETH_P_IPV6))
			return CNT_DROP_BAD_INNER;
		if (inner_len < sizeof(ip6))
			return CNT_DROP_BAD_LEN;
		if (bpf_skb_load_bytes(skb, in->ip_off, &ip6, sizeof(ip6)) < 0)
			return CNT_DROP_BAD_LEN;
		if (lbd_ip6_version(&ip6) != 6)
			return CNT_DROP_BAD_INNER;
		plen = bpf_ntohs(ip6.payload_len);
		if (sizeof(ip6) + plen > inner_len)
			return CNT_DROP_BAD_LEN;
		in->key.family = LBD_FAMILY_V6;
		__builtin_memcpy(in->key.client, ip6.saddr, 16);
		__builtin_memcpy(in->key.backend, ip6.daddr, 16);
		/* Extension headers (fragments included) are not walked: no entry. */
		return inner_ports(skb, in, in->ip_off + sizeof(ip6), plen, ip6.nexthdr);
	}
}

/* Creates or refreshes the NAT entry of a decapsulated packet. Returns 0 on success. */
LBD_INLINE int nat_record(struct inner *in)
{
	__u64 now = bpf_ktime_get_boot_ns();
	struct nat_val *cur = bpf_map_lookup_elem(&betc_nat, &in->key);

	if (cur && cur->family == in->val.family && cur->vip_port == in->val.vip_port &&
	    lbd_addr_eq(cur->vip, in->val.vip)) {
		nat_touch(cur, in->key.proto, in->ctl, now);
		count(CNT_NAT_REFRESHED);
		return 0;
	}
	in->val.last_seen = now;
	in->val.flags = 0;
	if (nat_closes(in->key.proto, in->ctl)) {
		in->val.flags = LBD_NAT_F_CLOSING;
		count(CNT_NAT_CLOSING);
	}
	if (bpf_map_update_elem(&betc_nat, &in->key, &in->val, BPF_ANY) < 0)
		return -1;
	count(cur ? CNT_NAT_REPLACED : CNT_NAT_CREATED);
	return 0;
}

#endif
