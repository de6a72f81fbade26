/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* QUIC-aware UDP services (included by lbxdp.c): a QUIC connection survives a change of
 * the client's address or port (NAT rebinding, a move to another network) because its
 * packets are routed by the server ID that the server encoded in the connection IDs it
 * chose, not by the 5-tuple (draft-ietf-quic-load-balancers, plaintext algorithm).
 *
 * A destination connection ID of the plaintext form: one octet whose top three bits
 * are the config rotation (0b111: unroutable) and whose other bits are the server's,
 * then the server ID (1-15 bytes), then the server's nonce. Only packets whose
 * destination ID the server chose carry one: short headers, and the long headers of
 * QUIC versions 1 and 2 other than Initial and 0-RTT (whose ID the client chose).
 * Everything else takes the 5-tuple path (conntrack, Maglev), which also keeps a
 * connection's Initial and 0-RTT packets together. This file holds its own maps. */
#ifndef LBXDP_QUIC_H
#define LBXDP_QUIC_H

#define LB_QUIC_V1 0x00000001
#define LB_QUIC_V2 0x6b3343cf
#define LB_QUIC_CID_MAX 20
#define LB_QUIC_CR_SHIFT 5

/* Server ID -> backend ID, per service; the daemon writes it from the backends'
 * configured server IDs. A drained backend keeps its ID (its connections go on), a
 * removed or disabled one loses it (its connections' packets are balanced again). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, LB_DEFAULT_MAX_BACKENDS);
	__uint(map_flags, BPF_F_NO_PREALLOC); /* empty where no service speaks QUIC */
	__type(key, struct lb_quic_key);
	__type(value, __u32);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lb_quic_sids SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, LB_QUIC_MAX);
	__type(key, __u32);
	__type(value, __u64);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lb_quic_stats SEC(".maps");

/* Whether a long header's destination ID is one the server chose: a Handshake packet
 * (RFC 9000 §17.2; its type bits differ in version 2, RFC 9369 §3.2). Retry and
 * version negotiation come from servers only. Returns LB_QUIC_ROUTED to go on. */
LBD_INLINE __u32 lb_quic_long_kind(__u8 first, __u32 version)
{
	__u8 type = (first >> 4) & 3;

	if (version == LB_QUIC_V1) {
		if (type == 0 || type == 1) /* Initial, 0-RTT */
			return LB_QUIC_CLIENT_CID;
		return type == 2 ? LB_QUIC_ROUTED : LB_QUIC_MALFORMED;
	}
	if (version == LB_QUIC_V2) {
		if (type == 1 || type == 2)
			return LB_QUIC_CLIENT_CID;
		return type == 3 ? LB_QUIC_ROUTED : LB_QUIC_MALFORMED;
	}
	/* Version 0 (negotiation) is the server's; any other version is a client's first
	 * flight to a server that may not speak it. */
	return version ? LB_QUIC_CLIENT_CID : LB_QUIC_MALFORMED;
}

/* The backend that the destination connection ID of the UDP payload at [off, end)
 * names for service svc_id, whose IDs are cfg: config rotation in bits 0-2, server ID
 * length in bits 8-15. Returns the backend ID (0: none) in the low 32 bits and the
 * enum lb_quic_route outcome above them.
 *
 * A global function: the verifier checks it once rather than along every path of
 * lb_handle_vip that reaches it. */
__noinline __u64 lb_quic_pick(struct xdp_md *ctx, __u32 off, __u32 end, __u32 svc_id, __u32 cfg)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct lb_quic_key k = { .service_id = svc_id };
	__u32 sid_len = (cfg >> 8) & 0xff, cid_off, *be;
	__u8 *p, first;

	if (off > LBD_MAX_L4_OFF + 8 || sid_len < 1 || sid_len > LB_QUIC_SID_MAX)
		return (__u64)LB_QUIC_MALFORMED << 32;
	p = data + off;
	if ((void *)(p + 7) > data_end || off + 1 > end)
		return (__u64)LB_QUIC_MALFORMED << 32;
	first = p[0];
	if (first & 0x80) {
		__u32 version = ((__u32)p[1] << 24) | ((__u32)p[2] << 16) | ((__u32)p[3] << 8) | p[4];
		__u32 kind = lb_quic_long_kind(first, version);

		if (kind != LB_QUIC_ROUTED)
			return (__u64)kind << 32;
		if (off + 6 > end)
			return (__u64)LB_QUIC_MALFORMED << 32;
		/* The ID's length is on the wire: it must hold the server ID. */
		if (p[5] < 1 + sid_len || p[5] > LB_QUIC_CID_MAX)
			return (__u64)LB_QUIC_MALFORMED << 32;
		cid_off = off + 6;
	} else {
		cid_off = off + 1;
	}
	/* The first octet of the ID, then the server ID, inside the datagram. */
	if (cid_off + 1 + sid_len > end)
		return (__u64)LB_QUIC_MALFORMED << 32;
	p = data + cid_off;
	if ((void *)(p + 1 + LB_QUIC_SID_MAX) <= data_end) {
		/* The common case, a datagram longer than the longest server ID: read the
		 * packet in place (no helper call), and clear what follows the ID. */
		if ((p[0] >> LB_QUIC_CR_SHIFT) != (cfg & 7))
			return (__u64)LB_QUIC_UNKNOWN_ID << 32;
		for (int i = 0; i < LB_QUIC_SID_MAX; i++)
			k.sid[i] = i < sid_len ? p[1 + i] : 0;
	} else {
		if (bpf_xdp_load_bytes(ctx, cid_off, &first, 1))
			return (__u64)LB_QUIC_MALFORMED << 32;
		if ((first >> LB_QUIC_CR_SHIFT) != (cfg & 7))
			return (__u64)LB_QUIC_UNKNOWN_ID << 32;
		if (bpf_xdp_load_bytes(ctx, cid_off + 1, k.sid, sid_len))
			return (__u64)LB_QUIC_MALFORMED << 32;
	}
	be = bpf_map_lookup_elem(&lb_quic_sids, &k);
	if (!be || !*be)
		return (__u64)LB_QUIC_UNKNOWN_ID << 32;
	return ((__u64)LB_QUIC_ROUTED << 32) | *be;
}

/* Count how a QUIC service's packet was routed, and keep it for a trace. */
LBD_INLINE void lb_quic_note(struct lb_pkt *pk, __u32 outcome)
{
	__u64 *n;

	pk->quic = outcome;
	if (pk->trace)
		return;
	n = bpf_map_lookup_elem(&lb_quic_stats, &outcome);
	if (n)
		(*n)++;
}

/* The backend of a QUIC service's packet by its connection ID, or NULL: then the
 * packet takes the 5-tuple path. A server ID naming a backend that is gone, or of
 * another family, falls back too. A routed packet's flow hash (the outer source
 * port) is its conntrack entry's (ct, NULL if none) when that names the same backend. */
LBD_INLINE struct lb_backend *lb_quic_backend(struct xdp_md *ctx, struct lb_pkt *pk, const struct lb_service *svc,
					       const struct lb_ct *ct, const struct lb_config *cfg, __u32 *be_id)
{
	__u64 r = lb_quic_pick(ctx, (pk->p.l4_off & LBD_L4_MASK) + sizeof(struct lbd_udphdr), pk->p.ip_end, svc->id,
			       svc->quic_config_id | ((__u32)svc->quic_sid_len << 8));
	__u32 outcome = r >> 32, id = (__u32)r;
	struct lb_backend *be = NULL;

	if (outcome == LB_QUIC_ROUTED) {
		be = lb_backend_get(id);
		if (!be || be->family != pk->flow.family) {
			be = NULL;
			outcome = LB_QUIC_UNKNOWN_ID;
		}
	}
	lb_quic_note(pk, outcome);
	if (!be)
		return NULL;
	*be_id = id;
	pk->hash = ct && ct->backend_id == id && ct->hash ? ct->hash : lb_hash_flow(&pk->flow, cfg->hash_seed);
	return be;
}

#endif
