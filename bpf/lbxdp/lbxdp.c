// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
//go:build ignore

/* LB-node datapath: XDP on the uplink. For a packet to a VIP service it picks a
 * backend (conntrack, then affinity, then the service's Maglev table), DNATs the
 * inner packet to the backend, wraps it in Geneve with the DSR option
 * (bpf/include/wire.h) toward the backend's node and sends it out by FIB lookup.
 *
 * Everything else passes to the kernel untouched, except frames whose headers
 * are inconsistent (the kernel would drop them too) and IP fragments of VIP
 * traffic: without reassembly only the first fragment carries ports, so later
 * fragments could not follow it to the same backend. They are dropped and
 * counted (LB_DROP_FRAGMENT); clients are expected to use path MTU discovery,
 * which the too-big replies below support.
 *
 * Two shortcuts keep the common packets cheap without changing any outcome:
 * a bitmap filter passes most non-VIP traffic before any hash lookup
 * (lb_vip_maybe), and an established flow whose service still owns its exact
 * destination skips the service lookups (lb_ct_service).
 *
 * Layout: this file holds the maps only this program uses (the ones it shares
 * with bpf/socklb are in lbstate.h), the per-packet context (struct lb_pkt) with
 * its counters and clock, and the flow of a packet (lb_xdp, lb_handle_vip). Each
 * concern lives in a header of its own, included after the maps it works on:
 * hash.h (flow hashing), vip.h (VIP filter, source ranges), conntrack.h (states,
 * timeouts, lookups), quic.h (QUIC routing by connection ID, with its maps),
 * route.h (FIB and its cache), encap.h (DNAT and Geneve), reply.h (ICMP errors and
 * TCP resets the node answers), icmp_error.h (ICMP errors forwarded to backends),
 * trace.h (side-effect-free runs) and monitor.h (events for `lbctl monitor`, with
 * the maps of their own). */
#include "lbd_net.h"
#include "lbd_csum.h"
#include "lbd_parse.h"
#include "wire.h"
#include "lbxdp.h"
#include "lbstate.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, LB_DEFAULT_MAX_SERVICES);
	__type(key, __u32);
	__type(value, struct lb_svc_entry);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lb_svc_by_id SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct lb_vip_bitmap);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lb_vip_filter SEC(".maps");

/* Conntrack, one map per family (see conntrack.h): IPv4 flows in a preallocated
 * hash, IPv6 flows in one that allocates entries as they come, so that a node
 * without IPv6 clients does not hold a table for them. Neither is an LRU. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, LB_DEFAULT_CT_SIZE);
	__type(key, struct lb_ct4_key);
	__type(value, struct lb_ct);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lb_ct4 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, LB_DEFAULT_CT_SIZE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct lb_ct_key);
	__type(value, struct lb_ct);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lb_ct6 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, LB_CT_EV_MAX);
	__type(key, __u32);
	__type(value, __u64);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lb_ct_stats SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, LB_DEFAULT_AFF_SIZE);
	__type(key, struct lb_aff_key);
	__type(value, struct lb_aff);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lb_affinity SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, LB_DEFAULT_SRC_SIZE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct lb_src_key);
	__type(value, __u8);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lb_src_ranges SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, LB_DEFAULT_MAX_SERVICES);
	__type(key, __u32);
	__type(value, struct lb_counter);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lb_svc_stats SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, LB_DEFAULT_MAX_BACKENDS);
	__type(key, __u32);
	__type(value, struct lb_counter);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lb_be_stats SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, LB_DROP_MAX);
	__type(key, __u32);
	__type(value, struct lb_counter);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lb_drop_stats SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, LB_DEFAULT_MAX_BACKENDS);
	__type(key, __u32);
	__type(value, struct lb_route);
} lb_fib_cache SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct lb_clock);
} lb_clock SEC(".maps");

/* Everything known about the packet being handled. */
struct lb_pkt {
	struct lbd_pkt p;
	struct lb_ct_key flow; /* client -> VIP as received */
	__u32 hash;            /* flow hash (5-tuple + seed) */
	__u32 ip_len;          /* bytes of the client's IP packet */
	__u8 tcp_flags;
	__u8 sctp_chunk;       /* type of an SCTP packet's first chunk */
	__u8 quic;             /* enum lb_quic_route of a QUIC service's packet */
	__u8 trace;            /* side-effect-free run (lb_trace_meta) */
	__u8 reason;           /* last counted reason (enum lb_drop_reason), for traces */
	__u8 fib_rc;           /* last FIB lookup result, for traces */
	__u8 fib_done;
};

/* Count a reason (enum lb_drop_reason) for the packet; the caller picks the verdict. */
LBD_INLINE void lb_note(struct lb_pkt *pk, __u32 reason)
{
	struct lb_counter *c;

	pk->reason = reason;
	if (pk->trace)
		return;
	c = bpf_map_lookup_elem(&lb_drop_stats, &reason);
	if (c) {
		c->packets++;
		c->bytes += pk->ip_len;
	}
}

LBD_INLINE int lb_drop(struct lb_pkt *pk, __u32 reason)
{
	lb_note(pk, reason);
	return XDP_DROP;
}

LBD_INLINE void lb_count(void *map, __u32 id, __u32 bytes, __u32 new_flow)
{
	struct lb_counter *c = bpf_map_lookup_elem(map, &id);

	if (c) {
		c->packets++;
		c->bytes += bytes;
		c->new_flows += new_flow;
	}
}

/* This CPU's clock, brought to the current tick: CLOCK_MONOTONIC_COARSE
 * (CLOCK_MONOTONIC as of the last tick), all that timeouts in seconds need. */
LBD_INLINE struct lb_clock *lb_tick(void)
{
	__u32 zero = 0;
	struct lb_clock *c = bpf_map_lookup_elem(&lb_clock, &zero);
	__u64 j = bpf_jiffies64();

	if (c && c->jiffies != j) {
		c->jiffies = j;
		c->ns = bpf_ktime_get_coarse_ns();
		c->sec = c->ns / LBD_NSEC_PER_SEC;
	}
	return c;
}

/* The coarse clock in nanoseconds. */
LBD_INLINE __u64 lb_now(void)
{
	struct lb_clock *c = lb_tick();

	return c ? c->ns : bpf_ktime_get_coarse_ns();
}

LBD_INLINE struct lb_config *lb_config_get(void)
{
	__u32 zero = 0;

	return bpf_map_lookup_elem(&lb_cfg, &zero);
}

#include "hash.h"
#include "vip.h"
#include "conntrack.h"
#include "quic.h"
#include "route.h"
#include "encap.h"
#include "reply.h"
#include "icmp_error.h"
#include "trace.h"
#include "monitor.h"

/* A packet lbd does not balance (another protocol, no service on that port): the
 * kernel's if it is not for a VIP. A VIP's is dropped: the LB node does not own the
 * VIP address, so the kernel would route the packet back to the router, which sends
 * it here again, until its TTL runs out. */
LBD_INLINE int lb_not_handled(struct lb_pkt *pk)
{
	return lb_vip_get(&pk->flow) ? lb_drop(pk, LB_DROP_NO_SERVICE) : XDP_PASS;
}

/* A packet whose destination address may be a VIP (lb_vip_filter). Whatever
 * it is dropped for must wait until lb_vips confirms the VIP: the filter has
 * false positives. */
LBD_INLINE int lb_handle_vip(struct xdp_md *ctx, struct lb_pkt *pk)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct lb_service_key sk;
	struct lb_service *svc = NULL;
	struct lb_backend *be = NULL;
	struct lb_config *cfg;
	struct lb_vip *vip;
	struct lb_ct *ct = NULL;
	struct lb_clock *clk;
	struct lb_route *rt;
	__u32 be_id = 0, hdr, new_flow = 0;
	__u64 now;
	int r, syn, stale = 0;

	if (pk->p.frag != LBD_FRAG_NONE)
		return lb_vip_get(&pk->flow) ? lb_drop(pk, LB_DROP_FRAGMENT) : XDP_PASS;

	switch (pk->p.proto) {
	case LBD_IPPROTO_TCP: {
		struct lbd_tcphdr *tcp = lbd_parse_tcp(data, data_end, &pk->p);

		if (!tcp)
			return lb_vip_get(&pk->flow) ? lb_drop(pk, LB_DROP_MALFORMED) : XDP_PASS;
		pk->flow.sport = tcp->source;
		pk->flow.dport = tcp->dest;
		pk->tcp_flags = tcp->flags;
		break;
	}
	case LBD_IPPROTO_UDP: {
		struct lbd_udphdr *udp = lbd_parse_udp(data, data_end, &pk->p);

		/* UDP over IPv6 must carry a checksum (RFC 8200 §8.1). */
		if (!udp || (pk->p.family == LBD_FAMILY_V6 && udp->check == 0))
			return lb_vip_get(&pk->flow) ? lb_drop(pk, LB_DROP_MALFORMED) : XDP_PASS;
		pk->flow.sport = udp->source;
		pk->flow.dport = udp->dest;
		break;
	}
	case LBD_IPPROTO_SCTP: {
		struct lbd_sctp_chunkhdr *ch;
		struct lbd_sctphdr *sh = lbd_parse_sctp(data, data_end, &pk->p, &ch);

		if (!sh)
			return lb_vip_get(&pk->flow) ? lb_drop(pk, LB_DROP_MALFORMED) : XDP_PASS;
		pk->flow.sport = sh->source;
		pk->flow.dport = sh->dest;
		pk->sctp_chunk = ch->type;
		break;
	}
	case LBD_IPPROTO_ICMP:
		if (pk->p.family != LBD_FAMILY_V4)
			return lb_not_handled(pk);
		return lb_icmp_error(ctx, pk);
	case LBD_IPPROTO_ICMPV6:
		if (pk->p.family != LBD_FAMILY_V6)
			return lb_not_handled(pk);
		return lb_icmp_error(ctx, pk);
	default:
		return lb_not_handled(pk);
	}
	pk->flow.proto = pk->p.proto;

	cfg = lb_config_get();
	clk = lb_tick();
	if (!cfg || !clk)
		return lb_drop(pk, LB_DROP_INTERNAL);
	now = clk->ns;

	/* Conntrack first: an established flow whose service is still the
	 * destination's needs no service lookup. A SYN (an SCTP INIT) almost
	 * always opens a flow: it skips the lookup and finds out whether the flow
	 * has an entry from its insert (lb_ct_create). */
	syn = lb_ct_opens(pk);
	/* A trace inserts nothing: it looks the SYN's flow up, to report the entry that
	 * the insert would find. */
	if (!syn || pk->trace) {
		ct = lb_ct_lookup(pk);
		if (ct && !lb_ct_usable(ct, pk, cfg, clk->sec)) {
			ct = NULL;
			stale = 1;
		}
		if (ct)
			svc = lb_ct_service(ct, &pk->flow);
	}
	/* The service of the exact port first: it exists only on a VIP, so the VIP
	 * lookup is needed only without one (all-ports services, no service, no VIP). */
	if (!svc) {
		__builtin_memcpy(sk.addr, pk->flow.daddr, 16);
		sk.port = pk->flow.dport;
		sk.proto = pk->p.proto;
		sk.family = pk->flow.family;
		svc = bpf_map_lookup_elem(&lb_services, &sk);
	}
	if (!svc) {
		vip = lb_vip_get(&pk->flow);
		if (!vip)
			return XDP_PASS;
		svc = lb_service_wild(&sk, vip);
		if (!svc)
			return lb_drop(pk, LB_DROP_NO_SERVICE);
	}

	if ((svc->flags & LB_SVC_SRC_RANGES) && !lb_src_allowed(svc, &pk->flow))
		return lb_drop(pk, LB_DROP_SRC_RANGE);

	/* A QUIC service's packet that names its server goes there, whatever its 5-tuple:
	 * the connection ID decides, and conntrack is not written (quic.h). */
	if ((svc->flags & LB_SVC_QUIC) && pk->p.proto == LBD_IPPROTO_UDP)
		be = lb_quic_backend(ctx, pk, svc, ct, cfg, &be_id);
	if (ct && !be) {
		be = lb_backend_get(ct->backend_id);
		if (be) {
			be_id = ct->backend_id;
			if (!pk->trace)
				lb_ct_touch(pk, ct, cfg, clk->sec);
			pk->hash = ct->hash;
			if (!pk->hash)
				pk->hash = lb_hash_flow(&pk->flow, cfg->hash_seed);
		}
	}

	if (!be) {
		struct lb_aff_key ak = {};
		struct lb_aff *aff;

		new_flow = 1;
		pk->hash = lb_hash_flow(&pk->flow, cfg->hash_seed);
		if (svc->flags & LB_SVC_AFFINITY) {
			ak.service_id = svc->id;
			ak.family = pk->flow.family;
			__builtin_memcpy(ak.addr, pk->flow.saddr, 16);
			aff = bpf_map_lookup_elem(&lb_affinity, &ak);
			/* A timestamp ahead of the coarse clock counts as fresh. */
			if (aff && (now < aff->last_seen_ns ||
				    now - aff->last_seen_ns <= (__u64)svc->affinity_timeout * LBD_NSEC_PER_SEC)) {
				be = lb_backend_get(aff->backend_id);
				if (be)
					be_id = aff->backend_id;
			}
		}
		if (!be) {
			be_id = lb_maglev_pick(svc, (svc->flags & LB_SVC_HASH_SRC) ?
							   lb_hash_src(&pk->flow, cfg->hash_seed) : pk->hash);
			be = lb_backend_get(be_id);
		}
		if (!be || be->family != pk->flow.family)
			return lb_no_backend(ctx, pk, svc);
		if (!pk->trace) {
			__u32 id = lb_ct_create(pk, clk, cfg, svc->id, be_id, stale);

			/* The flow had a usable entry after all (a retransmitted SYN). */
			if (id != be_id) {
				be_id = id;
				be = lb_backend_get(be_id);
				if (!be || be->family != pk->flow.family)
					return lb_no_backend(ctx, pk, svc);
				new_flow = 0;
			}
			if (new_flow && (svc->flags & LB_SVC_AFFINITY)) {
				struct lb_aff na = { .last_seen_ns = now, .backend_id = be_id };

				bpf_map_update_elem(&lb_affinity, &ak, &na, BPF_ANY);
			}
		}
	}

	if (!pk->trace)
		lb_count(&lb_svc_stats, svc->id, pk->ip_len, new_flow);

	hdr = lb_encap_len(be->node_family, pk->flow.family);
	r = lb_route(ctx, pk, be_id, be, cfg, now, hdr - LBD_ETH_HLEN + pk->ip_len, &rt);
	if (r == LB_ROUTE_TOO_BIG)
		return lb_too_big(ctx, pk, rt->mtu, hdr);
	if (r != LB_ROUTE_OK && r != LB_ROUTE_NO_NEIGH)
		return lb_route_drop(pk, r);
	if (lb_dnat(ctx, pk, be))
		return lb_drop(pk, LB_DROP_INTERNAL);
	if (!pk->trace)
		lb_count(&lb_be_stats, be_id, pk->ip_len, new_flow);
	return lb_encap(ctx, pk, be, cfg, rt, pk->flow.dport, r == LB_ROUTE_NO_NEIGH);
}

/* Parse the frame up to the IP header and hand VIP candidates on. */
LBD_INLINE int lb_process(struct xdp_md *ctx, struct lb_pkt *pk)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	__be16 proto;
	int r;

	if (lbd_parse_eth(data, data_end, &pk->p, &proto))
		return lb_drop(pk, LB_DROP_MALFORMED);

	if (proto == bpf_htons(LBD_ETH_P_IP)) {
		struct lbd_iphdr *ip;

		r = lbd_parse_ipv4(data, data_end, &pk->p);
		if (r != LBD_PARSE_OK)
			return lb_drop(pk, LB_DROP_MALFORMED);
		ip = data + (pk->p.l3_off & LBD_L3_MASK);
		if ((void *)(ip + 1) > data_end)
			return lb_drop(pk, LB_DROP_MALFORMED);
		if (!lb_vip_maybe(lb_vip_bucket(ip->daddr, LBD_FAMILY_V4)))
			return XDP_PASS;
		__builtin_memcpy(pk->flow.saddr, &ip->saddr, 4);
		__builtin_memcpy(pk->flow.daddr, &ip->daddr, 4);
		pk->flow.family = LBD_FAMILY_V4;
	} else if (proto == bpf_htons(LBD_ETH_P_IPV6)) {
		struct lbd_ipv6hdr *ip6;

		r = lbd_parse_ipv6(data, data_end, &pk->p);
		if (r == LBD_PARSE_MALFORMED)
			return lb_drop(pk, LB_DROP_MALFORMED);
		ip6 = data + (pk->p.l3_off & LBD_L3_MASK);
		if ((void *)(ip6 + 1) > data_end)
			return lb_drop(pk, LB_DROP_MALFORMED);
		{
			const __u32 *w = (const __u32 *)ip6->daddr;

			if (!lb_vip_maybe(lb_vip_bucket(w[0] ^ w[1] ^ w[2] ^ w[3], LBD_FAMILY_V6)))
				return XDP_PASS;
		}
		__builtin_memcpy(pk->flow.saddr, ip6->saddr, 16);
		__builtin_memcpy(pk->flow.daddr, ip6->daddr, 16);
		pk->flow.family = LBD_FAMILY_V6;
		/* An extension header chain longer than lbd follows: not balanced, and for a
		 * VIP not passed up either (it would loop through the router). */
		if (r != LBD_PARSE_OK)
			return lb_vip_get(&pk->flow) ? lb_drop(pk, LB_DROP_EXTHDRS) : XDP_PASS;
	} else {
		return XDP_PASS;
	}

	pk->ip_len = pk->p.ip_end - pk->p.l3_off;
	return lb_handle_vip(ctx, pk);
}

SEC("xdp")
int lb_xdp(struct xdp_md *ctx)
{
	struct lb_pkt pk;
	int verdict;

	__builtin_memset(&pk, 0, sizeof(pk));
	pk.reason = LB_REASON_NONE;
	pk.trace = lb_trace_requested(ctx);
	verdict = lb_process(ctx, &pk);
	if (pk.trace)
		lb_trace_record(ctx, &pk);
	else if (lbd_mon.flags)
		lb_monitor(ctx, pk.reason, verdict);
	return verdict;
}
