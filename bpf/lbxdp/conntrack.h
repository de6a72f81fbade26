/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Conntrack on LB nodes (included by lbxdp.c after its maps): states derived from
 * TCP flags, their timeouts, and the lookups of the per-packet flow. An entry keeps
 * a flow on its backend when the Maglev table changes. */
#ifndef LBXDP_CONNTRACK_H
#define LBXDP_CONNTRACK_H

/* Conntrack timestamps are rewritten at most this often per flow, so that an
 * established flow does not dirty its cache line on every packet. */
#define LB_CT_REFRESH_NS LBD_NSEC_PER_SEC

/* Timeout of an entry in a state, in nanoseconds. */
LBD_INLINE __u64 lb_ct_timeout(const struct lb_config *cfg, __u8 state)
{
	__u32 s;

	switch (state) {
	case LB_CT_SYN:
		s = cfg->tcp_syn_timeout;
		break;
	case LB_CT_ESTABLISHED:
		s = cfg->tcp_est_timeout;
		break;
	case LB_CT_CLOSING:
		s = cfg->tcp_close_timeout;
		break;
	default:
		s = cfg->udp_timeout;
	}
	return (__u64)s * LBD_NSEC_PER_SEC;
}

/* State of a new entry from the packet that creates it. A flow first seen
 * mid-connection (another LB node had it) starts established. */
LBD_INLINE __u8 lb_ct_state_new(const struct lb_pkt *pk)
{
	if (pk->p.proto != LBD_IPPROTO_TCP)
		return LB_CT_OTHER;
	if (pk->tcp_flags & (LBD_TCP_FIN | LBD_TCP_RST))
		return LB_CT_CLOSING;
	if ((pk->tcp_flags & (LBD_TCP_SYN | LBD_TCP_ACK)) == LBD_TCP_SYN)
		return LB_CT_SYN;
	return LB_CT_ESTABLISHED;
}

LBD_INLINE __u8 lb_ct_state_next(const struct lb_pkt *pk, __u8 state)
{
	if (pk->p.proto != LBD_IPPROTO_TCP)
		return LB_CT_OTHER;
	if (pk->tcp_flags & (LBD_TCP_FIN | LBD_TCP_RST))
		return LB_CT_CLOSING;
	if (state == LB_CT_SYN && !(pk->tcp_flags & LBD_TCP_SYN) && (pk->tcp_flags & LBD_TCP_ACK))
		return LB_CT_ESTABLISHED;
	return state;
}

/* A usable conntrack entry: not expired, and not a closing flow that a new
 * SYN re-balances. */
LBD_INLINE int lb_ct_usable(const struct lb_ct *ct, const struct lb_pkt *pk, __u64 now)
{
	return now <= ct->expires_ns &&
	       !(ct->state == LB_CT_CLOSING && (pk->tcp_flags & (LBD_TCP_SYN | LBD_TCP_ACK)) == LBD_TCP_SYN);
}

/* The packet's conntrack entry if it is usable. */
LBD_INLINE struct lb_ct *lb_ct_get(const struct lb_pkt *pk, __u64 now)
{
	struct lb_ct *ct = bpf_map_lookup_elem(&lb_conntrack, &pk->flow);

	return ct && lb_ct_usable(ct, pk, now) ? ct : NULL;
}

/* The service whose ID a conntrack entry holds, if it is still the service of
 * exactly the packet's destination (address, port and protocol): what
 * lb_services would return for the packet. Wildcard-port services are left to
 * the lookup, which must prefer an exact service added later. */
LBD_INLINE struct lb_service *lb_ct_service(const struct lb_ct *ct, const struct lb_ct_key *flow)
{
	struct lb_svc_entry *se = bpf_map_lookup_elem(&lb_svc_by_id, &ct->service_id);

	if (!se || se->key.port != flow->dport || !se->key.port || se->key.proto != flow->proto ||
	    se->key.family != flow->family || !lbd_addr_eq(se->key.addr, flow->daddr))
		return NULL;
	return &se->svc;
}

#endif
