//go:build ignore

// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* Backend-node datapath (docs/ARCHITECTURE.md, docs/wire-format.md).
 *
 * Ingress (tcx): Geneve from an allowed LB source carrying the DSR option is stripped
 * down to the inner IP packet behind the outer Ethernet header, and the NAT entry
 * (backend addr:port, client addr:port, proto) -> (VIP, port) is created or refreshed.
 * Geneve that is not lbd's (another VNI, no DSR option) belongs to another tunnel
 * endpoint on this node and passes unchanged.
 * Egress (tcx): replies hitting a NAT entry leave with source VIP:port; ICMP errors
 * about a NAT'ed flow are rewritten, quoted packet included.
 *
 * Headers are read with bpf_skb_load_bytes, so non-linear skbs need no pull. */
#include "lbd_net.h"
#include "lbd_csum.h"
#include "wire.h"
#include "lbd_monitor.h"
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

/* Report a dropped packet, as it is at the drop, to `lbctl monitor` (lbd_monitor.h).
 * A global function: the verifier checks it once, not once per drop. */
__attribute__((noinline)) int be_monitor(struct __sk_buff *skb, __u32 reason, __u32 hook)
{
	struct lbd_mon_event *ev;
	__u32 cap;

	ev = lbd_mon_reserve(skb->ifindex, skb->len, reason, LBD_TCX_DROP, hook);
	if (!ev)
		return 0;
	cap = lbd_mon_caplen(skb->len);
	if (cap == 0 || bpf_skb_load_bytes(skb, 0, ev->data, cap))
		cap = 0;
	ev->cap_len = cap;
	bpf_ringbuf_submit(ev, 0);
	return 0;
}

/* hook is the program's enum lbd_mon_hook. */
LBD_INLINE int drop(struct __sk_buff *skb, __u32 hook, __u32 reason)
{
	count(reason);
	if (lbd_mon.flags & LBD_MON_REASONS)
		be_monitor(skb, reason, hook);
	return LBD_TCX_DROP;
}

LBD_INLINE int drop_in(struct __sk_buff *skb, __u32 reason)
{
	return drop(skb, LBD_MON_HOOK_TC_INGRESS, reason);
}

LBD_INLINE int drop_out(struct __sk_buff *skb, __u32 reason)
{
	return drop(skb, LBD_MON_HOOK_TC_EGRESS, reason);
}

#include "nat.h"
#include "decap.h"
#include "snat.h"

/* UDP to the Geneve port that is not lbd's, or cannot be shown to be: another tunnel
 * endpoint on this node (a Geneve CNI, another lbd deployment on another VNI) owns
 * it, so it goes to the kernel exactly as it came. */
LBD_INLINE int pass_foreign(void)
{
	count(CNT_PASS_FOREIGN);
	return LBD_TCX_NEXT;
}

/* Whether the outer source is an allowed LB node. The address is read again here,
 * once a packet claims to be lbd's, rather than kept from the outer header: a key
 * built per family and carried through the option walk would double the states the
 * verifier explores there. IPv4 is looked up IPv4-mapped (backendtc.h). */
LBD_INLINE int lb_source_allowed(struct __sk_buff *skb)
{
	struct lpm_key lk = { .prefixlen = 128 };
	__u32 src4 = LBD_ETH_HLEN + offsetof(struct lbd_iphdr, saddr);
	__u32 src6 = LBD_ETH_HLEN + offsetof(struct lbd_ipv6hdr, saddr);

	if (skb->protocol == bpf_htons(LBD_ETH_P_IP)) {
		lk.addr[10] = 0xff;
		lk.addr[11] = 0xff;
		if (bpf_skb_load_bytes(skb, src4, &lk.addr[12], 4) < 0)
			return 0;
	} else if (bpf_skb_load_bytes(skb, src6, lk.addr, 16) < 0) {
		return 0;
	}
	return bpf_map_lookup_elem(&betc_allowed, &lk) != NULL;
}

/* The checks run from the cheapest: anything but UDP to the Geneve port leaves after
 * reading two headers. Geneve is then lbd's only when its header is version 0 with
 * the configured VNI and its options carry lbd's DSR option; anything else, including
 * what is too broken to read that far, passes (pass_foreign). A packet that is lbd's
 * is decapsulated or dropped, never passed: its outer source must be an allowed LB
 * node (it claims to be lbd's, so a stranger's is a spoof), and then every fault
 * found in it is a drop. */
SEC("tcx/ingress")
int lbd_be_ingress(struct __sk_buff *skb)
{
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
		/* A fragmented Geneve packet cannot be judged or decapsulated piecewise; the
		 * stack reassembles it for whichever tunnel endpoint listens, if any. */
		if (ip.frag_off & bpf_htons(LBD_IP_MF)) {
			count(CNT_PASS_FRAGMENT);
			return LBD_TCX_NEXT;
		}
		tot = bpf_ntohs(ip.tot_len);
		if (tot < lbd_ip4_hlen(&ip) + sizeof(udp) || off + tot > skb->len)
			return pass_foreign();
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
		plen = bpf_ntohs(ip6.payload_len);
		if (plen < sizeof(udp) || off + sizeof(ip6) + plen > skb->len)
			return pass_foreign();
		udp_len = plen;
	} else {
		return LBD_TCX_NEXT;
	}

	/* Until lbd's option is found, a header that cannot be read, or read as lbd
	 * writes it, says nothing about whose packet this is. */
	if (bpf_ntohs(udp.len) != udp_len)
		return pass_foreign();
	gen_off = udp_off + sizeof(udp);
	if (udp_len < sizeof(udp) + sizeof(gh) ||
	    bpf_skb_load_bytes(skb, gen_off, &gh, sizeof(gh)) < 0)
		return pass_foreign();
	/* Another version lays its options out otherwise; another VNI is another overlay
	 * (or another lbd deployment). */
	if ((gh.opt_len_ver >> 6) != 0)
		return pass_foreign();
	vni = bpf_ntohl(gh.vni_rsvd) >> 8;
	cfg = bpf_map_lookup_elem(&betc_config, &zero);
	if (!cfg || vni != cfg->vni)
		return pass_foreign();
	opt_len = (gh.opt_len_ver & 0x3f) * 4;
	if (udp_len < sizeof(udp) + sizeof(gh) + opt_len)
		return pass_foreign();
	ret = parse_dsr_opt(skb, gen_off + sizeof(gh), opt_len, &in.val);
	if (ret == OPT_FOREIGN)
		return pass_foreign();

	/* lbd's option at lbd's VNI: ours, or a spoof of ours. */
	if (!lb_source_allowed(skb))
		return drop_in(skb, CNT_DROP_NOT_ALLOWED);
	/* lbd sends data packets carrying an Ethernet frame, nothing else. */
	if ((gh.flags & LBD_GENEVE_FLAG_OAM) || gh.proto != bpf_htons(LBD_GENEVE_PROTO_ETH))
		return drop_in(skb, CNT_DROP_BAD_GENEVE);
	if (ret != OPT_OK)
		return drop_in(skb, ret);
	if (udp_len < sizeof(udp) + sizeof(gh) + opt_len + LBD_ETH_HLEN)
		return drop_in(skb, CNT_DROP_BAD_LEN);

	in.ip_off = gen_off + sizeof(gh) + opt_len + LBD_ETH_HLEN;
	if (bpf_skb_load_bytes(skb, in.ip_off - 2, &in.eth_proto, sizeof(in.eth_proto)) < 0)
		return drop_in(skb, CNT_DROP_BAD_LEN);
	ret = parse_inner(skb, &in, udp_len - sizeof(udp) - sizeof(gh) - opt_len - LBD_ETH_HLEN);
	if (ret)
		return drop_in(skb, ret);
	/* Port 0 in the option (an all-ports service) means the port is kept. */
	if (!in.val.vip_port)
		in.val.vip_port = in.key.backend_port;

	/* Remove everything between the outer Ethernet header and the inner IP header;
	 * the outer Ethernet header stays (its destination is this host) with the inner
	 * EtherType, and the DECAP_L3 flag sets skb->protocol to the inner family. */
	decap_flags = in.val.family == LBD_FAMILY_V4 ? LBD_ADJ_ROOM_DECAP_L3_IPV4 :
						     LBD_ADJ_ROOM_DECAP_L3_IPV6;
	if (bpf_skb_adjust_room(skb, -(__s32)(in.ip_off - LBD_ETH_HLEN), BPF_ADJ_ROOM_MAC, decap_flags))
		return drop_in(skb, CNT_DROP_DECAP_FAILED);
	if (bpf_skb_store_bytes(skb, 12, &in.eth_proto, sizeof(in.eth_proto), 0))
		return drop_in(skb, CNT_DROP_DECAP_FAILED);
	count(CNT_DECAP_OK);

	if (!in.has_ports) {
		count(CNT_DECAP_NO_NAT);
		return LBD_TCX_NEXT;
	}
	if (nat_record(&in))
		return drop_in(skb, CNT_DROP_NAT_FAILED);
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
		if (ip.protocol == LBD_IPPROTO_TCP || ip.protocol == LBD_IPPROTO_UDP || ip.protocol == LBD_IPPROTO_SCTP) {
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
		if (ip6.nexthdr == LBD_IPPROTO_TCP || ip6.nexthdr == LBD_IPPROTO_UDP ||
		    ip6.nexthdr == LBD_IPPROTO_SCTP) {
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
