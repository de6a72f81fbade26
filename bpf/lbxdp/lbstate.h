/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* The service state that the XDP program and the socket-level programs (bpf/socklb)
 * both read: VIPs, services, Maglev tables, backends and the config. Each object
 * declares these maps; the socket programs are loaded with the XDP datapath's maps
 * in their place, so there is one copy of the truth, written by one Datapath. */
#ifndef LBSTATE_H
#define LBSTATE_H

#include "lbxdp.h"

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, LB_DEFAULT_MAX_SERVICES);
	__type(key, struct lb_vip_key);
	__type(value, struct lb_vip);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lb_vips SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, LB_DEFAULT_MAX_SERVICES);
	__type(key, struct lb_service_key);
	__type(value, struct lb_service);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lb_services SEC(".maps");

/* Per-service Maglev table: one array map of 64-byte elements (bpf/lbxdp/tables.go).
 *   element 0        the head: the size M, and in its top bit which half is active
 *   1 .. I           the service's backend IDs, 16 per element; a slot holds an index
 *                    into them, so a slot takes 2 bytes whatever the backend IDs
 *   then two halves  of S = ceil(M / 32) elements, 32 slots each
 * The daemon changes a table by writing the inactive half (and any new index), then
 * flipping the bit: no map swap, so no RCU grace period per change. It writes the
 * half that was active only at the next change, long after any packet that read the
 * old head. A new service or size swaps the inner map. Keeping M inside the table
 * means a lookup can never pair a new size with an old table. */
#define LB_TABLE_HALF 0x80000000u
enum lb_table_layout {
	LB_TABLE_SLOTS = 32,
	LB_TABLE_IDS = 16,
};
/* Generated for Go by bpf2go -type (tables.go reads it). */
struct lb_state_btf_types {
	enum lb_table_layout table_layout;
};
LBD_BTF_TYPES(lb_state_btf_types);

struct lb_table_head {
	__u32 size;     /* M; LB_TABLE_HALF set: the second half is active */
	__u32 id_elems; /* I, fixed for the map's lifetime */
	__u32 pad[14];  /* the daemon's: what the table was built from */
};

struct lb_table_elem {
	union {
		struct lb_table_head head;
		__u32 id[LB_TABLE_IDS];
		__u16 slot[LB_TABLE_SLOTS];
	};
};

_Static_assert(sizeof(struct lb_table_elem) == 4 * LB_TABLE_IDS, "a table element is 64 bytes");

/* The value is declared as words: clang leaves a struct that only an inner map
 * definition names as an unsized forward declaration in BTF. */
struct lb_maglev_inner {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__uint(map_flags, BPF_F_INNER_MAP);
	__type(key, __u32);
	__type(value, __u32[LB_TABLE_IDS]);
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY_OF_MAPS);
	__uint(max_entries, LB_DEFAULT_MAX_SERVICES);
	__type(key, __u32);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
	__array(values, struct lb_maglev_inner);
} lb_tables SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, LB_DEFAULT_MAX_BACKENDS);
	__type(key, __u32);
	__type(value, struct lb_backend);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lb_backends SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct lb_config);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lb_cfg SEC(".maps");

LBD_INLINE struct lb_backend *lb_backend_get(__u32 id)
{
	struct lb_backend *be;

	if (!id)
		return NULL;
	be = bpf_map_lookup_elem(&lb_backends, &id);
	if (!be || !be->family)
		return NULL;
	return be;
}

/* Backend ID from the service's Maglev table, 0 if the service has no table. */
LBD_INLINE __u32 lb_maglev_pick(const struct lb_service *svc, __u32 hash)
{
	__u32 id = svc->id, k = 0, head, ids, m, idx, bi;
	struct lb_table_elem *e;
	void *table;

	table = bpf_map_lookup_elem(&lb_tables, &id);
	if (!table)
		return 0;
	e = bpf_map_lookup_elem(table, &k);
	if (!e)
		return 0;
	/* One read of each: the daemon rewrites the head when it flips the half. */
	head = *(volatile __u32 *)&e->head.size;
	ids = *(volatile __u32 *)&e->head.id_elems;
	m = head & ~LB_TABLE_HALF;
	if (!m)
		return 0;
	idx = hash % m;
	k = 1 + ids + idx / LB_TABLE_SLOTS;
	if (head & LB_TABLE_HALF)
		k += (m + LB_TABLE_SLOTS - 1) / LB_TABLE_SLOTS;
	e = bpf_map_lookup_elem(table, &k);
	if (!e)
		return 0;
	bi = e->slot[idx % LB_TABLE_SLOTS];
	k = 1 + bi / LB_TABLE_IDS;
	if (k > ids)
		return 0;
	e = bpf_map_lookup_elem(table, &k);
	return e ? e->id[bi % LB_TABLE_IDS] : 0;
}

/* The all-ports service of the key's VIP and protocol, if the VIP has one. */
LBD_INLINE struct lb_service *lb_service_wild(struct lb_service_key *sk, const struct lb_vip *vip)
{
	__u16 wild = sk->proto == LBD_IPPROTO_TCP ? vip->wild_tcp :
		     sk->proto == LBD_IPPROTO_UDP ? vip->wild_udp : vip->wild_sctp;

	if (!wild)
		return NULL;
	sk->port = 0;
	return bpf_map_lookup_elem(&lb_services, sk);
}

/* The service of the key: the one of its port, else the all-ports one. */
LBD_INLINE struct lb_service *lb_service_get(struct lb_service_key *sk, const struct lb_vip *vip)
{
	struct lb_service *svc = bpf_map_lookup_elem(&lb_services, sk);

	return svc ? svc : lb_service_wild(sk, vip);
}

#endif
