//go:build ignore

// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* Backend-node datapath (DESIGN.md §1, §2).
 *
 * Ingress (tcx): Geneve from an allowed LB source carrying the DSR option is stripped
 * down to the inner IP packet behind the outer Ethernet header, and the NAT entry
 * (backend addr:port, client addr:port, proto) -> (VIP, port) is created or refreshed.
 * Egress (tcx): replies hitting a NAT entry leave with source VIP:port; ICMP errors
 * about a NAT'ed flow are rewritten, quoted packet included.
 *
 * Headers are read with bpf_skb_load_bytes, so non-linear skbs need no pull. */
#include <linux/types.h>
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#include "wire.h"
#include "hdr.h"
#include "backendtc.h"
#include "csum.h"

char __license[] SEC("license") = "Dual BSD/GPL";

/* Result of parse_dsr_opt when the option was found and is well-formed. */
#define OPT_OK CNT_MAX

static __always_inline void count(__u32 reason)
{
	__u64 *v = bpf_map_lookup_elem(&betc_counters, &reason);

	if (v)
		*v += 1;
}

static __always_inline int drop(__u32 reason)
{
	count(reason);
	return LBD_TCX_DROP;
}

static __always_inline int addr_eq(const __u8 *a, const __u8 *b)
{
	const __u32 *x = (const __u32 *)a, *y = (const __u32 *)b;

	return x[0] == y[0] && x[1] == y[1] && x[2] == y[2] && x[3] == y[3];
}

static __always_inline void addr_copy(__u8 *dst, const __u8 *src)
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
static __always_inline void nat_touch(struct nat_val *v, __u8 proto, __u8 tcp_flags, __u64 now)
{
	__u8 flags = v->flags;

	if (proto == IPPROTO_TCP) {
		if ((tcp_flags & (TCP_FLAG_SYN | TCP_FLAG_ACK)) == TCP_FLAG_SYN)
			flags &= ~LBD_NAT_F_CLOSING;
		if (tcp_flags & (TCP_FLAG_FIN | TCP_FLAG_RST))
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

/* Walks the Geneve options at opts_off (opt_len bytes) and fills val with the DSR
 * option's VIP and port. Returns OPT_OK or the drop reason. */
static __always_inline __u32 parse_dsr_opt(struct __sk_buff *skb, __u32 opts_off, __u32 opt_len,
					   struct nat_val *val)
{
	__u32 pos = 0;
	int found = 0;
	int i;

	for (i = 0; i < LBD_MAX_GENEVE_OPTS; i++) {
		struct lbd_geneve_opthdr oh;
		__u32 olen;

		if (pos >= opt_len)
			break;
		if (pos + sizeof(oh) > opt_len)
			return CNT_DROP_MALFORMED_OPT;
		if (bpf_skb_load_bytes(skb, opts_off + pos, &oh, sizeof(oh)) < 0)
			return CNT_DROP_BAD_LEN;
		olen = (oh.len & 0x1f) * 4;
		if (pos + sizeof(oh) + olen > opt_len)
			return CNT_DROP_MALFORMED_OPT;
		if (oh.opt_class == bpf_htons(LBD_OPT_CLASS) && oh.type == LBD_OPT_TYPE) {
			if (found)
				return CNT_DROP_MALFORMED_OPT;
			if (olen == LBD_OPT_LEN4_V4 * 4) {
				struct lbd_dsr_opt4 o;

				if (bpf_skb_load_bytes(skb, opts_off + pos, &o, sizeof(o)) < 0)
					return CNT_DROP_BAD_LEN;
				if (o.pad)
					return CNT_DROP_MALFORMED_OPT;
				__builtin_memcpy(val->vip, &o.vip, 4);
				val->vip_port = o.port;
				val->family = LBD_AF_INET;
			} else if (olen == LBD_OPT_LEN4_V6 * 4) {
				struct lbd_dsr_opt6 o;

				if (bpf_skb_load_bytes(skb, opts_off + pos, &o, sizeof(o)) < 0)
					return CNT_DROP_BAD_LEN;
				if (o.pad)
					return CNT_DROP_MALFORMED_OPT;
				__builtin_memcpy(val->vip, o.vip, 16);
				val->vip_port = o.port;
				val->family = LBD_AF_INET6;
			} else {
				return CNT_DROP_MALFORMED_OPT;
			}
			found = 1;
		} else if (oh.type & LBD_OPT_CRITICAL) {
			return CNT_DROP_UNKNOWN_CRITICAL;
		}
		pos += sizeof(oh) + olen;
	}
	if (pos < opt_len)
		return CNT_DROP_MALFORMED_OPT; /* more options than we walk */
	if (!found)
		return CNT_DROP_MISSING_OPT;
	return OPT_OK;
}

/* Parsed inner packet: where its IP header starts and the NAT entry it asks for. */
struct inner {
	struct nat_key key;
	struct nat_val val;
	__u32 ip_off;
	__be16 eth_proto;
	__u8 tcp_flags;
	__u8 has_ports;
};

/* Reads the L4 ports (and TCP flags) of the inner packet into in->key. Returns 0, or
 * the drop reason when the L4 header does not fit in the IP payload. */
static __always_inline __u32 inner_ports(struct __sk_buff *skb, struct inner *in, __u32 l4_off,
					 __u32 l4_len, __u8 proto)
{
	if (proto == IPPROTO_TCP) {
		struct tcp_hdr th;

		if (l4_len < sizeof(th))
			return CNT_DROP_BAD_LEN;
		if (bpf_skb_load_bytes(skb, l4_off, &th, sizeof(th)) < 0)
			return CNT_DROP_BAD_LEN;
		in->key.client_port = th.source;
		in->key.backend_port = th.dest;
		in->tcp_flags = th.flags;
	} else if (proto == IPPROTO_UDP) {
		struct udp_hdr uh;

		if (l4_len < sizeof(uh))
			return CNT_DROP_BAD_LEN;
		if (bpf_skb_load_bytes(skb, l4_off, &uh, sizeof(uh)) < 0)
			return CNT_DROP_BAD_LEN;
		in->key.client_port = uh.source;
		in->key.backend_port = uh.dest;
	} else {
		return 0;
	}
	in->key.proto = proto;
	in->has_ports = 1;
	return 0;
}

/* Parses the inner IP packet at in->ip_off, inner_len bytes long (Ethernet padding
 * included). Returns 0 or the drop reason. */
static __always_inline __u32 parse_inner(struct __sk_buff *skb, struct inner *in, __u32 inner_len)
{
	if (in->val.family == LBD_AF_INET) {
		struct ip4hdr ip;
		__u32 hl, tot;

		if (in->eth_proto != bpf_htons(ETH_P_IP))
			return CNT_DROP_BAD_INNER;
		if (inner_len < sizeof(ip))
			return CNT_DROP_BAD_LEN;
		if (bpf_skb_load_bytes(skb, in->ip_off, &ip, sizeof(ip)) < 0)
			return CNT_DROP_BAD_LEN;
		if (IP4_VERSION(&ip) != 4 || IP4_HLEN(&ip) < sizeof(ip))
			return CNT_DROP_BAD_INNER;
		hl = IP4_HLEN(&ip);
		tot = bpf_ntohs(ip.tot_len);
		if (tot < hl || tot > inner_len)
			return CNT_DROP_BAD_LEN;
		in->key.family = LBD_AF_INET;
		__builtin_memcpy(in->key.client, &ip.saddr, 4);
		__builtin_memcpy(in->key.backend, &ip.daddr, 4);
		/* Later fragments carry no ports: decapsulated, but they make no entry. */
		if (ip.frag_off & bpf_htons(IP_OFFSET))
			return 0;
		return inner_ports(skb, in, in->ip_off + hl, tot - hl, ip.protocol);
	} else {
		struct ip6hdr ip6;
		__u32 plen;

		if (in->eth_proto != bpf_htons(ETH_P_IPV6))
			return CNT_DROP_BAD_INNER;
		if (inner_len < sizeof(ip6))
			return CNT_DROP_BAD_LEN;
		if (bpf_skb_load_bytes(skb, in->ip_off, &ip6, sizeof(ip6)) < 0)
			return CNT_DROP_BAD_LEN;
		if (IP6_VERSION(&ip6) != 6)
			return CNT_DROP_BAD_INNER;
		plen = bpf_ntohs(ip6.payload_len);
		if (sizeof(ip6) + plen > inner_len)
			return CNT_DROP_BAD_LEN;
		in->key.family = LBD_AF_INET6;
		__builtin_memcpy(in->key.client, ip6.saddr, 16);
		__builtin_memcpy(in->key.backend, ip6.daddr, 16);
		/* Extension headers (fragments included) are not walked: no entry. */
		return inner_ports(skb, in, in->ip_off + sizeof(ip6), plen, ip6.nexthdr);
	}
}

/* Creates or refreshes the NAT entry of a decapsulated packet. Returns 0 on success. */
static __always_inline int nat_record(struct inner *in)
{
	__u64 now = bpf_ktime_get_boot_ns();
	struct nat_val *cur = bpf_map_lookup_elem(&betc_nat, &in->key);

	if (cur && cur->family == in->val.family && cur->vip_port == in->val.vip_port &&
	    addr_eq(cur->vip, in->val.vip)) {
		nat_touch(cur, in->key.proto, in->tcp_flags, now);
		count(CNT_NAT_REFRESHED);
		return 0;
	}
	in->val.last_seen = now;
	in->val.flags = 0;
	if (in->key.proto == IPPROTO_TCP && (in->tcp_flags & (TCP_FLAG_FIN | TCP_FLAG_RST))) {
		in->val.flags = LBD_NAT_F_CLOSING;
		count(CNT_NAT_CLOSING);
	}
	if (bpf_map_update_elem(&betc_nat, &in->key, &in->val, BPF_ANY) < 0)
		return -1;
	count(cur ? CNT_NAT_REPLACED : CNT_NAT_CREATED);
	return 0;
}

SEC("tcx/ingress")
int lbd_be_ingress(struct __sk_buff *skb)
{
	struct lpm_key lk = {};
	struct inner in = {};
	struct lbd_genevehdr gh;
	struct udp_hdr udp;
	struct config *cfg;
	__u32 off = ETH_HLEN, udp_off, udp_len, gen_off, opt_len, zero = 0, vni, ret;
	__u64 decap_flags;

	if (skb->protocol == bpf_htons(ETH_P_IP)) {
		struct ip4hdr ip;
		__u32 tot;

		if (bpf_skb_load_bytes(skb, off, &ip, sizeof(ip)) < 0)
			return LBD_TCX_NEXT;
		if (IP4_VERSION(&ip) != 4 || IP4_HLEN(&ip) < sizeof(ip) || ip.protocol != IPPROTO_UDP)
			return LBD_TCX_NEXT;
		/* A later fragment has no UDP header to recognise: not ours to judge. */
		if (ip.frag_off & bpf_htons(IP_OFFSET))
			return LBD_TCX_NEXT;
		udp_off = off + IP4_HLEN(&ip);
		if (bpf_skb_load_bytes(skb, udp_off, &udp, sizeof(udp)) < 0)
			return LBD_TCX_NEXT;
		if (udp.dest != bpf_htons(LBD_GENEVE_PORT))
			return LBD_TCX_NEXT;
		/* A fragmented Geneve packet cannot be decapsulated piecewise; the stack
		 * reassembles it and, having no Geneve socket, refuses it. */
		if (ip.frag_off & bpf_htons(IP_MF)) {
			count(CNT_PASS_FRAGMENT);
			return LBD_TCX_NEXT;
		}
		lk.prefixlen = 96 + 32;
		lk.addr[10] = 0xff;
		lk.addr[11] = 0xff;
		__builtin_memcpy(&lk.addr[12], &ip.saddr, 4);
		if (!bpf_map_lookup_elem(&betc_allowed, &lk))
			return drop(CNT_DROP_NOT_ALLOWED);
		tot = bpf_ntohs(ip.tot_len);
		if (tot < IP4_HLEN(&ip) + sizeof(udp) || off + tot > skb->len)
			return drop(CNT_DROP_BAD_LEN);
		udp_len = tot - IP4_HLEN(&ip);
	} else if (skb->protocol == bpf_htons(ETH_P_IPV6)) {
		struct ip6hdr ip6;
		__u32 plen;

		if (bpf_skb_load_bytes(skb, off, &ip6, sizeof(ip6)) < 0)
			return LBD_TCX_NEXT;
		if (IP6_VERSION(&ip6) != 6 || ip6.nexthdr != IPPROTO_UDP)
			return LBD_TCX_NEXT;
		udp_off = off + sizeof(ip6);
		if (bpf_skb_load_bytes(skb, udp_off, &udp, sizeof(udp)) < 0)
			return LBD_TCX_NEXT;
		if (udp.dest != bpf_htons(LBD_GENEVE_PORT))
			return LBD_TCX_NEXT;
		lk.prefixlen = 128;
		__builtin_memcpy(lk.addr, ip6.saddr, 16);
		if (!bpf_map_lookup_elem(&betc_allowed, &lk))
			return drop(CNT_DROP_NOT_ALLOWED);
		plen = bpf_ntohs(ip6.payload_len);
		if (plen < sizeof(udp) || off + sizeof(ip6) + plen > skb->len)
			return drop(CNT_DROP_BAD_LEN);
		udp_len = plen;
	} else {
		return LBD_TCX_NEXT;
	}

	if (bpf_ntohs(udp.len) != udp_len)
		return drop(CNT_DROP_BAD_LEN);
	gen_off = udp_off + sizeof(udp);
	if (udp_len < sizeof(udp) + sizeof(gh) ||
	    bpf_skb_load_bytes(skb, gen_off, &gh, sizeof(gh)) < 0)
		return drop(CNT_DROP_BAD_LEN);
	/* Version 0, not a control (O) packet, an Ethernet frame inside. */
	if ((gh.opt_len_ver >> 6) != 0 || (gh.flags & 0x80) ||
	    gh.proto != bpf_htons(LBD_GENEVE_PROTO_ETH))
		return drop(CNT_DROP_BAD_GENEVE);
	vni = ((__u32)gh.vni[0] << 16) | ((__u32)gh.vni[1] << 8) | gh.vni[2];
	cfg = bpf_map_lookup_elem(&betc_config, &zero);
	if (!cfg || vni != cfg->vni)
		return drop(CNT_DROP_VNI);
	opt_len = (gh.opt_len_ver & 0x3f) * 4;
	if (udp_len < sizeof(udp) + sizeof(gh) + opt_len + ETH_HLEN)
		return drop(CNT_DROP_BAD_LEN);

	ret = parse_dsr_opt(skb, gen_off + sizeof(gh), opt_len, &in.val);
	if (ret != OPT_OK)
		return drop(ret);

	in.ip_off = gen_off + sizeof(gh) + opt_len + ETH_HLEN;
	if (bpf_skb_load_bytes(skb, in.ip_off - 2, &in.eth_proto, sizeof(in.eth_proto)) < 0)
		return drop(CNT_DROP_BAD_LEN);
	ret = parse_inner(skb, &in, udp_len - sizeof(udp) - sizeof(gh) - opt_len - ETH_HLEN);
	if (ret)
		return drop(ret);
	/* Port 0 in the option (an all-ports service) means the port is kept. */
	if (!in.val.vip_port)
		in.val.vip_port = in.key.backend_port;

	/* Remove everything between the outer Ethernet header and the inner IP header;
	 * the outer Ethernet header stays (its destination is this host) with the inner
	 * EtherType, and the DECAP_L3 flag sets skb->protocol to the inner family. */
	decap_flags = in.val.family == LBD_AF_INET ? LBD_ADJ_ROOM_DECAP_L3_IPV4 :
						     LBD_ADJ_ROOM_DECAP_L3_IPV6;
	if (bpf_skb_adjust_room(skb, -(__s32)(in.ip_off - ETH_HLEN), BPF_ADJ_ROOM_MAC, decap_flags))
		return drop(CNT_DROP_DECAP_FAILED);
	if (bpf_skb_store_bytes(skb, 12, &in.eth_proto, sizeof(in.eth_proto), 0))
		return drop(CNT_DROP_DECAP_FAILED);
	count(CNT_DECAP_OK);

	if (!in.has_ports) {
		count(CNT_DECAP_NO_NAT);
		return LBD_TCX_NEXT;
	}
	if (nat_record(&in))
		return drop(CNT_DROP_NAT_FAILED);
	return LBD_TCX_NEXT;
}

/* SNAT of a reply: key holds the addresses and family; ports and proto are read
 * here. ip_off is the IP header, l4_off the TCP/UDP header. */
static __always_inline int snat(struct __sk_buff *skb, struct nat_key *key, __u32 ip_off,
				__u32 l4_off, __u8 proto)
{
	struct nat_val *v;
	__u8 vip[16];
	__be16 ports[2], vport;
	__u32 csum_off = l4_off + (proto == IPPROTO_TCP ? offsetof(struct tcp_hdr, check) :
							  offsetof(struct udp_hdr, check));
	__u8 tcp_flags = 0;

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

	if (key->family == LBD_AF_INET) {
		__be32 from, to;
		/* A UDP checksum of 0 means "none" over IPv4 and must stay 0. */
		__u64 mm = proto == IPPROTO_UDP ? BPF_F_MARK_MANGLED_0 : 0;

		__builtin_memcpy(&from, key->backend, 4);
		__builtin_memcpy(&to, vip, 4);
		if (bpf_l4_csum_replace(skb, csum_off, from, to, BPF_F_PSEUDO_HDR | mm | 4) ||
		    bpf_l4_csum_replace(skb, csum_off, ports[0], vport, mm | 2) ||
		    bpf_l3_csum_replace(skb, ip_off + offsetof(struct ip4hdr, check), from, to, 4) ||
		    bpf_skb_store_bytes(skb, ip_off + offsetof(struct ip4hdr, saddr), &to, 4, 0))
			return drop(CNT_DROP_SNAT_FAILED);
	} else {
		__s64 diff = bpf_csum_diff((__be32 *)key->backend, 16, (__be32 *)vip, 16, 0);

		if (diff < 0 ||
		    bpf_l4_csum_replace(skb, csum_off, 0, diff, BPF_F_PSEUDO_HDR) ||
		    bpf_l4_csum_replace(skb, csum_off, ports[0], vport, 2) ||
		    bpf_skb_store_bytes(skb, ip_off + offsetof(struct ip6hdr, saddr), vip, 16, 0))
			return drop(CNT_DROP_SNAT_FAILED);
	}
	if (bpf_skb_store_bytes(skb, l4_off, &vport, sizeof(vport), 0))
		return drop(CNT_DROP_SNAT_FAILED);
	if (proto == IPPROTO_TCP && bpf_skb_load_bytes(skb, l4_off + 13, &tcp_flags, 1) < 0)
		tcp_flags = 0;
	nat_touch(v, proto, tcp_flags, bpf_ktime_get_boot_ns());
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
static __always_inline int rewrite_quoted(struct __sk_buff *skb, struct quoted *q,
					  const __u8 *vip, __be16 vport, int v6)
{
	__u32 icsum = q->icmp_off + 2;
	__u32 l4_csum_off = q->l4_off + (q->key.proto == IPPROTO_TCP ?
					 offsetof(struct tcp_hdr, check) :
					 offsetof(struct udp_hdr, check));
	__u32 dst_off = q->ip_off + (v6 ? offsetof(struct ip6hdr, daddr) :
				     offsetof(struct ip4hdr, daddr));
	int nwords = v6 ? 8 : 2;
	__u16 l4_old, l4_new;

	/* The quoted L4 checksum is present when the error quotes enough of the packet
	 * (Linux quotes up to 576/1280 bytes); a zero UDP checksum stays zero. */
	if (bpf_skb_load_bytes(skb, l4_csum_off, &l4_old, 2) == 0 &&
	    !(q->key.proto == IPPROTO_UDP && l4_old == 0)) {
		l4_new = csum_replace_words(l4_old, (__u16 *)q->key.backend, (const __u16 *)vip,
					    nwords);
		l4_new = csum_replace2(l4_new, q->key.backend_port, vport);
		if (q->key.proto == IPPROTO_UDP && l4_new == 0)
			l4_new = 0xffff;
		if (bpf_skb_store_bytes(skb, l4_csum_off, &l4_new, 2, 0) ||
		    bpf_l4_csum_replace(skb, icsum, l4_old, l4_new, 2))
			return -1;
	}
	if (!v6) {
		__u16 ipc_new = csum_replace_words(q->ip_check, (__u16 *)q->key.backend,
						   (const __u16 *)vip, 2);
		__be32 from, to;

		__builtin_memcpy(&from, q->key.backend, 4);
		__builtin_memcpy(&to, vip, 4);
		if (bpf_skb_store_bytes(skb, q->ip_off + offsetof(struct ip4hdr, check), &ipc_new,
					2, 0) ||
		    bpf_l4_csum_replace(skb, icsum, q->ip_check, ipc_new, 2) ||
		    bpf_l4_csum_replace(skb, icsum, from, to, 4) ||
		    bpf_skb_store_bytes(skb, dst_off, &to, 4, 0))
			return -1;
	} else {
		__s64 diff = bpf_csum_diff((__be32 *)q->key.backend, 16, (__be32 *)vip, 16, 0);

		if (diff < 0 || bpf_l4_csum_replace(skb, icsum, 0, diff, 0) ||
		    bpf_skb_store_bytes(skb, dst_off, vip, 16, 0))
			return -1;
	}
	if (bpf_l4_csum_replace(skb, icsum, q->key.backend_port, vport, 2) ||
	    bpf_skb_store_bytes(skb, q->l4_off + 2, &vport, sizeof(vport), 0))
		return -1;
	return 0;
}

static __always_inline int quoted_ports(struct __sk_buff *skb, struct quoted *q, __u8 proto)
{
	__be16 ports[2];

	if (proto != IPPROTO_TCP && proto != IPPROTO_UDP)
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
static __always_inline int icmp4_error(struct __sk_buff *skb, struct ip4hdr *ip, __u32 l4_off)
{
	struct quoted q = {};
	struct icmp_hdr ih;
	struct ip4hdr eip;
	struct nat_val *v;
	__u8 vip[16];
	__be16 vport;

	if (bpf_skb_load_bytes(skb, l4_off, &ih, sizeof(ih)) < 0)
		return LBD_TCX_NEXT;
	if (ih.type != ICMP_DEST_UNREACH && ih.type != ICMP_TIME_EXCEEDED &&
	    ih.type != ICMP_PARAMETERPROB)
		return LBD_TCX_NEXT;
	q.icmp_off = l4_off;
	q.ip_off = l4_off + sizeof(ih);
	if (bpf_skb_load_bytes(skb, q.ip_off, &eip, sizeof(eip)) < 0)
		return LBD_TCX_NEXT;
	if (IP4_VERSION(&eip) != 4 || IP4_HLEN(&eip) < sizeof(eip) || (eip.frag_off & bpf_htons(IP_OFFSET)) ||
	    eip.saddr != ip->daddr)
		return LBD_TCX_NEXT;
	q.l4_off = q.ip_off + IP4_HLEN(&eip);
	if (quoted_ports(skb, &q, eip.protocol))
		return LBD_TCX_NEXT;
	q.key.family = LBD_AF_INET;
	__builtin_memcpy(q.key.backend, &eip.daddr, 4);
	__builtin_memcpy(q.key.client, &eip.saddr, 4);
	q.ip_check = eip.check;
	v = bpf_map_lookup_elem(&betc_nat, &q.key);
	if (!v)
		return LBD_TCX_NEXT;
	addr_copy(vip, v->vip);
	vport = v->vip_port;

	if (rewrite_quoted(skb, &q, vip, vport, 0))
		return drop(CNT_DROP_SNAT_FAILED);
	/* An error from a router function of this node keeps its own source. */
	if (ip->saddr == eip.daddr) {
		__be32 to;

		__builtin_memcpy(&to, vip, 4);
		if (bpf_l3_csum_replace(skb, ETH_HLEN + offsetof(struct ip4hdr, check), ip->saddr,
					to, 4) ||
		    bpf_skb_store_bytes(skb, ETH_HLEN + offsetof(struct ip4hdr, saddr), &to, 4, 0))
			return drop(CNT_DROP_SNAT_FAILED);
	}
	count(CNT_ICMP_TRANSLATED);
	return LBD_TCX_NEXT;
}

static __always_inline int icmp6_error(struct __sk_buff *skb, struct ip6hdr *ip6, __u32 l4_off)
{
	struct quoted q = {};
	struct icmp_hdr ih;
	struct ip6hdr eip;
	struct nat_val *v;
	__u8 vip[16];
	__be16 vport;

	if (bpf_skb_load_bytes(skb, l4_off, &ih, sizeof(ih)) < 0)
		return LBD_TCX_NEXT;
	if (ih.type != ICMPV6_DEST_UNREACH && ih.type != ICMPV6_PKT_TOOBIG &&
	    ih.type != ICMPV6_TIME_EXCEED && ih.type != ICMPV6_PARAMPROB)
		return LBD_TCX_NEXT;
	q.icmp_off = l4_off;
	q.ip_off = l4_off + sizeof(ih);
	if (bpf_skb_load_bytes(skb, q.ip_off, &eip, sizeof(eip)) < 0)
		return LBD_TCX_NEXT;
	if (IP6_VERSION(&eip) != 6 || !addr_eq(eip.saddr, ip6->daddr))
		return LBD_TCX_NEXT;
	q.l4_off = q.ip_off + sizeof(eip);
	if (quoted_ports(skb, &q, eip.nexthdr))
		return LBD_TCX_NEXT;
	q.key.family = LBD_AF_INET6;
	__builtin_memcpy(q.key.backend, eip.daddr, 16);
	__builtin_memcpy(q.key.client, eip.saddr, 16);
	v = bpf_map_lookup_elem(&betc_nat, &q.key);
	if (!v)
		return LBD_TCX_NEXT;
	addr_copy(vip, v->vip);
	vport = v->vip_port;

	if (rewrite_quoted(skb, &q, vip, vport, 1))
		return drop(CNT_DROP_SNAT_FAILED);
	if (addr_eq(ip6->saddr, q.key.backend)) {
		/* The source address is part of ICMPv6's pseudo-header. */
		__s64 diff = bpf_csum_diff((__be32 *)q.key.backend, 16, (__be32 *)vip, 16, 0);

		if (diff < 0 ||
		    bpf_l4_csum_replace(skb, q.icmp_off + 2, 0, diff, BPF_F_PSEUDO_HDR) ||
		    bpf_skb_store_bytes(skb, ETH_HLEN + offsetof(struct ip6hdr, saddr), vip, 16, 0))
			return drop(CNT_DROP_SNAT_FAILED);
	}
	count(CNT_ICMP_TRANSLATED);
	return LBD_TCX_NEXT;
}

SEC("tcx/egress")
int lbd_be_egress(struct __sk_buff *skb)
{
	struct nat_key key = {};

	if (skb->protocol == bpf_htons(ETH_P_IP)) {
		struct ip4hdr ip;
		__u32 l4_off;

		if (bpf_skb_load_bytes(skb, ETH_HLEN, &ip, sizeof(ip)) < 0)
			return LBD_TCX_NEXT;
		if (IP4_VERSION(&ip) != 4 || IP4_HLEN(&ip) < sizeof(ip))
			return LBD_TCX_NEXT;
		/* Later fragments carry no ports to look the flow up with. */
		if (ip.frag_off & bpf_htons(IP_OFFSET))
			return LBD_TCX_NEXT;
		l4_off = ETH_HLEN + IP4_HLEN(&ip);
		if (ip.protocol == IPPROTO_TCP || ip.protocol == IPPROTO_UDP) {
			key.family = LBD_AF_INET;
			__builtin_memcpy(key.backend, &ip.saddr, 4);
			__builtin_memcpy(key.client, &ip.daddr, 4);
			return snat(skb, &key, ETH_HLEN, l4_off, ip.protocol);
		}
		if (ip.protocol == IPPROTO_ICMP)
			return icmp4_error(skb, &ip, l4_off);
		return LBD_TCX_NEXT;
	}
	if (skb->protocol == bpf_htons(ETH_P_IPV6)) {
		struct ip6hdr ip6;
		__u32 l4_off = ETH_HLEN + sizeof(ip6);

		if (bpf_skb_load_bytes(skb, ETH_HLEN, &ip6, sizeof(ip6)) < 0)
			return LBD_TCX_NEXT;
		if (IP6_VERSION(&ip6) != 6)
			return LBD_TCX_NEXT;
		if (ip6.nexthdr == IPPROTO_TCP || ip6.nexthdr == IPPROTO_UDP) {
			key.family = LBD_AF_INET6;
			__builtin_memcpy(key.backend, ip6.saddr, 16);
			__builtin_memcpy(key.client, ip6.daddr, 16);
			return snat(skb, &key, ETH_HLEN, l4_off, ip6.nexthdr);
		}
		if (ip6.nexthdr == IPPROTO_ICMPV6)
			return icmp6_error(skb, &ip6, l4_off);
	}
	return LBD_TCX_NEXT;
}
