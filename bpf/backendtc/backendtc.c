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
#include "lbd_net.h"
#include "lbd_csum.h"
#include "wire.h"
#include "backendtc.h"

char __license[] SEC("license") = "Dual BSD/GPL";

/* Concerns live in headers of their own, included after the counters they use:
 * nat.h (a NAT entry's lifetime), decap.h (ingress) and snat.h (egress). */

LBD_INLINE void count(__u32 reason)
{
	__u64 *v = bpf_map_lookup_elem(&betc_counters, &reason);

	if (v)
		*v += 1;
}

LBD_INLINE int drop(__u32 reason)
{
	count(reason);
	return LBD_TCX_DROP;
}

#include "nat.h"
#include "decap.h"
#include "snat.h"

SEC("tcx/ingress")
int lbd_be_ingress(struct __sk_buff *skb)
{
	struct lpm_key lk = {};
	struct inner in = {};
	struct lbd_genevehdr gh;
	struct lbd_udphdr udp;
	struct config *cfg;
	__u32 off = LBD_ETH_HLEN, udp_off, udp_len, gen_off, opt_len, zero = 0, vni, ret;
	__u64 decap_flags;

	if (skb->protocol == bpf_htons(LBD_ETH_P_IP)) {
		struct lbd_iphdr ip;
		__u32 tot;

		if (bpf_skb_load_bytes(skb, off, &ip, sizeof(ip)) < 0)
			return LBD_TCX_NEXT;
		if (lbd_ip4_version(&ip) != 4 || lbd_ip4_hlen(&ip) < sizeof(ip) || ip.protocol != LBD_IPPROTO_UDP)
			return LBD_TCX_NEXT;
		/* A later fragment has no UDP header to recognise: not ours to judge. */
		if (ip.frag_off & bpf_htons(LBD_IP_OFFMASK))
			return LBD_TCX_NEXT;
		udp_off = off + lbd_ip4_hlen(&ip);
		if (bpf_skb_load_bytes(skb, udp_off, &udp, sizeof(udp)) < 0)
			return LBD_TCX_NEXT;
		if (udp.dest != bpf_htons(LBD_GENEVE_PORT))
			return LBD_TCX_NEXT;
		/* A fragmented Geneve packet cannot be decapsulated piecewise; the stack
		 * reassembles it and, having no Geneve socket, refuses it. */
		if (ip.frag_off & bpf_htons(LBD_IP_MF)) {
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
		if (tot < lbd_ip4_hlen(&ip) + sizeof(udp) || off + tot > skb->len)
			return drop(CNT_DROP_BAD_LEN);
		udp_len = tot - lbd_ip4_hlen(&ip);
	} else if (skb->protocol == bpf_htons(LBD_ETH_P_IPV6)) {
		struct lbd_ipv6hdr ip6;
		__u32 plen;

		if (bpf_skb_load_bytes(skb, off, &ip6, sizeof(ip6)) < 0)
			return LBD_TCX_NEXT;
		if (lbd_ip6_version(&ip6) != 6 || ip6.nexthdr != LBD_IPPROTO_UDP)
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
	if ((gh.opt_len_ver >> 6) != 0 || (gh.flags & LBD_GENEVE_FLAG_OAM) ||
	    gh.proto != bpf_htons(LBD_GENEVE_PROTO_ETH))
		return drop(CNT_DROP_BAD_GENEVE);
	vni = bpf_ntohl(gh.vni_rsvd) >> 8;
	cfg = bpf_map_lookup_elem(&betc_config, &zero);
	if (!cfg || vni != cfg->vni)
		return drop(CNT_DROP_VNI);
	opt_len = (gh.opt_len_ver & 0x3f) * 4;
	if (udp_len < sizeof(udp) + sizeof(gh) + opt_len + LBD_ETH_HLEN)
		return drop(CNT_DROP_BAD_LEN);

	ret = parse_dsr_opt(skb, gen_off + sizeof(gh), opt_len, &in.val);
	if (ret != OPT_OK)
		return drop(ret);

	in.ip_off = gen_off + sizeof(gh) + opt_len + LBD_ETH_HLEN;
	if (bpf_skb_load_bytes(skb, in.ip_off - 2, &in.eth_proto, sizeof(in.eth_proto)) < 0)
		return drop(CNT_DROP_BAD_LEN);
	ret = parse_inner(skb, &in, udp_len - sizeof(udp) - sizeof(gh) - opt_len - LBD_ETH_HLEN);
	if (ret)
		return drop(ret);
	/* Port 0 in the option (an all-ports service) means the port is kept. */
	if (!in.val.vip_port)
		in.val.vip_port = in.key.backend_port;

	/* Remove everything between the outer Ethernet header and the inner IP header;
	 * the outer Ethernet header stays (its destination is this host) with the inner
	 * EtherType, and the DECAP_L3 flag sets skb->protocol to the inner family. */
	decap_flags = in.val.family == LBD_FAMILY_V4 ? LBD_ADJ_ROOM_DECAP_L3_IPV4 :
						     LBD_ADJ_ROOM_DECAP_L3_IPV6;
	if (bpf_skb_adjust_room(skb, -(__s32)(in.ip_off - LBD_ETH_HLEN), BPF_ADJ_ROOM_MAC, decap_flags))
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

SEC("tcx/egress")
int lbd_be_egress(struct __sk_buff *skb)
{
	struct nat_key key = {};

	if (skb->protocol == bpf_htons(LBD_ETH_P_IP)) {
		struct lbd_iphdr ip;
		__u32 l4_off;

		if (bpf_skb_load_bytes(skb, LBD_ETH_HLEN, &ip, sizeof(ip)) < 0)
			return LBD_TCX_NEXT;
		if (lbd_ip4_version(&ip) != 4 || lbd_ip4_hlen(&ip) < sizeof(ip))
			return LBD_TCX_NEXT;
		/* Later fragments carry no ports to look the flow up with. */
		if (ip.frag_off & bpf_htons(LBD_IP_OFFMASK))
			return LBD_TCX_NEXT;
		l4_off = LBD_ETH_HLEN + lbd_ip4_hlen(&ip);
		if (ip.protocol == LBD_IPPROTO_TCP || ip.protocol == LBD_IPPROTO_UDP) {
			key.family = LBD_FAMILY_V4;
			__builtin_memcpy(key.backend, &ip.saddr, 4);
			__builtin_memcpy(key.client, &ip.daddr, 4);
			return snat(skb, &key, LBD_ETH_HLEN, l4_off, ip.protocol);
		}
		if (ip.protocol == LBD_IPPROTO_ICMP)
			return icmp4_error(skb, &ip, l4_off);
		return LBD_TCX_NEXT;
	}
	if (skb->protocol == bpf_htons(LBD_ETH_P_IPV6)) {
		struct lbd_ipv6hdr ip6;
		__u32 l4_off = LBD_ETH_HLEN + sizeof(ip6);

		if (bpf_skb_load_bytes(skb, LBD_ETH_HLEN, &ip6, sizeof(ip6)) < 0)
			return LBD_TCX_NEXT;
		if (lbd_ip6_version(&ip6) != 6)
			return LBD_TCX_NEXT;
		if (ip6.nexthdr == LBD_IPPROTO_TCP || ip6.nexthdr == LBD_IPPROTO_UDP) {
			key.family = LBD_FAMILY_V6;
			__builtin_memcpy(key.backend, ip6.saddr, 16);
			__builtin_memcpy(key.client, ip6.daddr, 16);
			return snat(skb, &key, LBD_ETH_HLEN, l4_off, ip6.nexthdr);
		}
		if (ip6.nexthdr == LBD_IPPROTO_ICMPV6)
			return icmp6_error(skb, &ip6, l4_off);
	}
	return LBD_TCX_NEXT;
}
