/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Conntrack on LB nodes (included by lbxdp.c after its maps): states derived from
 * TCP flags and SCTP chunk types, their timeouts, the lookup of the packet's flow, the insert of a new
 * one and the flood guard. An entry keeps a flow on its backend when the Maglev
 * table changes.
 *
 * The maps (lb_ct4, lb_ct6) are plain hashes, not LRUs: an insert never evicts
 * another flow, so no flood can push established flows out. The daemon sizes each
 * a quarter above the configured capacity and its collector deletes expired
 * entries, and under pressure unconfirmed then idle ones, before the headroom runs
 * out; an insert into a full table fails, is counted, and the flow is balanced
 * untracked. A new flow costs one insert (BPF_NOEXIST) and no lookup: only when
 * the flow has an entry already (a retransmitted SYN, another CPU first) is it
 * read. */
#ifndef LBXDP_CONNTRACK_H
#define LBXDP_CONNTRACK_H

/* The key of the packet's IPv4 flow in lb_ct4. */
LBD_INLINE void lb_ct4_key(const struct lb_pkt *pk, struct lb_ct4_key *k)
{
	__builtin_memset(k, 0, sizeof(*k));
	__builtin_memcpy(&k->saddr, pk->flow.saddr, 4);
	__builtin_memcpy(&k->daddr, pk->flow.daddr, 4);
	k->sport = pk->flow.sport;
	k->dport = pk->flow.dport;
	k->proto = pk->flow.proto;
}

/* The packet's conntrack entry, usable or not. */
LBD_INLINE struct lb_ct *lb_ct_lookup(const struct lb_pkt *pk)
{
	if (pk->flow.family == LBD_FAMILY_V4) {
		struct lb_ct4_key k;

		lb_ct4_key(pk, &k);
		return bpf_map_lookup_elem(&lb_ct4, &k);
	}
	return bpf_map_lookup_elem(&lb_ct6, &pk->flow);
}

/* Write the packet's conntrack entry (flags: BPF_NOEXIST or BPF_ANY). */
LBD_INLINE long lb_ct_update(const struct lb_pkt *pk, const struct lb_ct *ct, __u64 flags)
{
	if (pk->flow.family == LBD_FAMILY_V4) {
		struct lb_ct4_key k;

		lb_ct4_key(pk, &k);
		return bpf_map_update_elem(&lb_ct4, &k, ct, flags);
	}
	return bpf_map_update_elem(&lb_ct6, &pk->flow, ct, flags);
}

LBD_INLINE void lb_ct_event(struct lb_pkt *pk, __u32 ev)
{
	__u64 *n;

	if (pk->trace)
		return;
	n = bpf_map_lookup_elem(&lb_ct_stats, &ev);
	if (n)
		(*n)++;
}

/* Timeout of an entry, in seconds. */
LBD_INLINE __u32 lb_ct_timeout(const struct lb_config *cfg, const struct lb_ct *ct)
{
	if (ct->flags & LB_CT_F_TENTATIVE)
		return cfg->tentative_timeout;
	switch (ct->state) {
	case LB_CT_SYN:
		return cfg->tcp_syn_timeout;
	case LB_CT_ESTABLISHED:
		return cfg->tcp_est_timeout;
	case LB_CT_CLOSING:
		return cfg->tcp_close_timeout;
	case LB_CT_SCTP_INIT:
	case LB_CT_SCTP_COOKIE:
		return cfg->sctp_init_timeout;
	case LB_CT_SCTP_ESTABLISHED:
		return cfg->sctp_est_timeout;
	case LB_CT_SCTP_SHUTDOWN:
	case LB_CT_SCTP_CLOSED:
		return cfg->sctp_close_timeout;
	}
	return cfg->udp_timeout;
}

/* Whether the packet opens a connection: a TCP SYN without ACK, an SCTP INIT. */
LBD_INLINE int lb_ct_opens(const struct lb_pkt *pk)
{
	if (pk->p.proto == LBD_IPPROTO_SCTP)
		return pk->sctp_chunk == LBD_SCTP_INIT;
	return (pk->tcp_flags & (LBD_TCP_SYN | LBD_TCP_ACK)) == LBD_TCP_SYN;
}

/* SCTP state after a packet whose first chunk is the packet's (RFC 9260 §4, as seen
 * from the client's side only). An INIT on a live association is the peer
 * restarting it (§5.2.4): the entry stays where it is. */
LBD_INLINE __u8 lb_ct_sctp_next(__u8 chunk, __u8 state)
{
	switch (chunk) {
	case LBD_SCTP_ABORT:
	case LBD_SCTP_SHUTDOWN_COMPLETE:
		return LB_CT_SCTP_CLOSED;
	case LBD_SCTP_SHUTDOWN:
	case LBD_SCTP_SHUTDOWN_ACK:
		return LB_CT_SCTP_SHUTDOWN;
	case LBD_SCTP_INIT:
		return state == LB_CT_OTHER || state == LB_CT_SCTP_CLOSED ? LB_CT_SCTP_INIT : state;
	case LBD_SCTP_COOKIE_ECHO:
		return state == LB_CT_OTHER || state == LB_CT_SCTP_INIT ? LB_CT_SCTP_COOKIE : state;
	}
	return state == LB_CT_OTHER || state == LB_CT_SCTP_INIT || state == LB_CT_SCTP_COOKIE ?
		       LB_CT_SCTP_ESTABLISHED : state;
}

/* State of a new entry from the packet that creates it. A flow first seen
 * mid-connection (another LB node had it) starts established, but tentative. */
LBD_INLINE __u8 lb_ct_state_new(const struct lb_pkt *pk)
{
	if (pk->p.proto == LBD_IPPROTO_SCTP)
		return lb_ct_sctp_next(pk->sctp_chunk, LB_CT_OTHER);
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
	if (pk->p.proto == LBD_IPPROTO_SCTP)
		return lb_ct_sctp_next(pk->sctp_chunk, state);
	if (pk->p.proto != LBD_IPPROTO_TCP)
		return LB_CT_OTHER;
	if (pk->tcp_flags & (LBD_TCP_FIN | LBD_TCP_RST))
		return LB_CT_CLOSING;
	if (state == LB_CT_SYN && !(pk->tcp_flags & LBD_TCP_SYN) && (pk->tcp_flags & LBD_TCP_ACK))
		return LB_CT_ESTABLISHED;
	return state;
}

/* A usable conntrack entry: idle no longer than its timeout, and not a closed
 * flow that a new SYN or INIT re-balances. The signed difference keeps an entry
 * that another CPU's clock, a tick ahead, wrote a second later than now. */
LBD_INLINE int lb_ct_usable(const struct lb_ct *ct, const struct lb_pkt *pk, const struct lb_config *cfg,
			    __u32 sec)
{
	return (__s32)(sec - ct->last_seen) <= (__s32)lb_ct_timeout(cfg, ct) &&
	       !((ct->state == LB_CT_CLOSING || ct->state == LB_CT_SCTP_CLOSED) && lb_ct_opens(pk));
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

/* A packet of a tracked flow: advance the state, and at most once a second (or
 * on a state change, or to confirm a tentative entry) the time and hash. */
LBD_INLINE void lb_ct_touch(struct lb_pkt *pk, struct lb_ct *ct, const struct lb_config *cfg, __u32 sec)
{
	__u8 state = lb_ct_state_next(pk, ct->state);

	if (state == ct->state && sec == ct->last_seen && !(ct->flags & LB_CT_F_TENTATIVE))
		return;
	if (ct->flags & LB_CT_F_TENTATIVE) {
		ct->flags &= ~LB_CT_F_TENTATIVE;
		lb_ct_event(pk, LB_CT_EV_CONFIRMED);
	}
	ct->state = state;
	ct->last_seen = sec;
	ct->hash = (__u16)lb_hash_flow(&pk->flow, cfg->hash_seed);
}

/* Whether a new flow may take a conntrack entry: at most cfg->ct_guard_rate a
 * second on this CPU. Past it the flow is still balanced by the Maglev table,
 * which sends it to the same backend as long as the table does not change. */
LBD_INLINE int lb_ct_admit(struct lb_pkt *pk, struct lb_clock *clk, const struct lb_config *cfg)
{
	if (!cfg->ct_guard_rate)
		return 1;
	if (clk->guard_sec != clk->sec) {
		clk->guard_sec = clk->sec;
		clk->guard_flows = 0;
	}
	if (clk->guard_flows < cfg->ct_guard_rate) {
		clk->guard_flows++;
		return 1;
	}
	if (clk->guard_flows == cfg->ct_guard_rate) {
		clk->guard_flows++;
		lb_ct_event(pk, LB_CT_EV_GUARD_ENGAGED);
	}
	lb_ct_event(pk, LB_CT_EV_GUARD_SKIPPED);
	return 0;
}

/* Record a new flow on backend be_id, and return the backend it must take: be_id,
 * or that of a usable entry the flow has already (a retransmitted SYN, a packet
 * another CPU handled first). stale: the flow has an entry that is no longer
 * usable, which the new one replaces. */
LBD_INLINE __u32 lb_ct_create(struct lb_pkt *pk, struct lb_clock *clk, const struct lb_config *cfg,
			      __u32 svc_id, __u32 be_id, int stale)
{
	struct lb_ct nct = {
		.backend_id = be_id,
		.service_id = svc_id,
		.last_seen = clk->sec,
		.hash = (__u16)pk->hash,
		.state = lb_ct_state_new(pk),
	};
	struct lb_ct *cur;
	long err;

	if (nct.state != LB_CT_SYN && nct.state != LB_CT_SCTP_INIT)
		nct.flags = LB_CT_F_TENTATIVE;
	if (!lb_ct_admit(pk, clk, cfg))
		return be_id;
	err = lb_ct_update(pk, &nct, stale ? BPF_ANY : BPF_NOEXIST);
	if (err == -LBD_EEXIST) {
		cur = lb_ct_lookup(pk);
		if (cur && lb_ct_usable(cur, pk, cfg, clk->sec) && lb_backend_get(cur->backend_id)) {
			lb_ct_touch(pk, cur, cfg, clk->sec);
			return cur->backend_id;
		}
		err = lb_ct_update(pk, &nct, BPF_ANY);
	}
	if (err) {
		lb_ct_event(pk, LB_CT_EV_INSERT_FAILED);
		return be_id;
	}
	lb_ct_event(pk, LB_CT_EV_INSERTED);
	if (nct.flags & LB_CT_F_TENTATIVE)
		lb_ct_event(pk, LB_CT_EV_TENTATIVE);
	return be_id;
}

#endif
