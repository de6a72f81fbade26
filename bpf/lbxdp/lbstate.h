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

/* Per-service Maglev table. Slot 0 holds the table size M, and in its top bit which
 * half is active; slots 1..M and M+1..2M are the two halves. The daemon changes a table
 * by writing the inactive half and flipping the bit (no map swap, so no RCU wait in the
 * kernel); a new service or size swaps the inner map. Keeping M inside the table means
 * a lookup can never pair a new size with an old table. */
#define LB_TABLE_HALF 0x80000000u
struct lb_maglev_inner {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 2);
	__uint(map_flags, BPF_F_INNER_MAP);
	__type(key, __u32);
	__type(value, __u32);
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY_OF_MAPS);
	__uint(max_entries, LB_DEFAULT_MAX_SERVICES);
	__type(key, __u32);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
	__array(values, struct lb_maglev_inner);
} lb_maglev SEC(".maps");

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
	__u32 id = svc->id, zero = 0, idx, head, m, *size, *slot;
	void *table;

	table = bpf_map_lookup_elem(&lb_maglev, &id);
	if (!table)
		return 0;
	/* Slot 0: the size M, and in its top bit the active half (slots 1..M or M+1..2M);
	 * the daemon writes the other half and flips this bit to change the table. */
	size = bpf_map_lookup_elem(table, &zero);
	if (!size)
		return 0;
	head = *size;
	m = head & ~LB_TABLE_HALF;
	if (!m)
		return 0;
	idx = hash % m + 1 + ((head & LB_TABLE_HALF) ? m : 0);
	slot = bpf_map_lookup_elem(table, &idx);
	return slot ? *slot : 0;
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
