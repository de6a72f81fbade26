/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Map layouts of the socket-level programs. The Go package mirrors these through
 * bpf2go -type; change both together. Addresses are 16 bytes with IPv4 in the first
 * four, as in lbxdp.h. */
#ifndef SOCKLB_H
#define SOCKLB_H

#include "lbd_net.h"

#define SK_DEFAULT_REVNAT_SIZE 262144
#define SK_DEFAULT_UDP_SIZE 65536
#define SK_DEFAULT_AFF_SIZE 65536

/* What the programs did (index of sk_stats). */
enum sk_stat {
	SK_STAT_CONNECT = 0,  /* connect() to a service translated to a backend */
	SK_STAT_SENDMSG,      /* unconnected UDP send translated */
	SK_STAT_REVERSE,      /* recvmsg/getpeername source translated back to the service */
	SK_STAT_NO_BACKEND,   /* connect() or send refused: the service has no usable backend */
	SK_STAT_REVNAT_FULL,  /* translated, but the reverse entry could not be stored */
	SK_STAT_MAX,
};

/* A translated socket's peer as the kernel sees it (the backend), for the reverse
 * translation of recvmsg and getpeername. */
struct sk_rev_key {
	__u64 cookie; /* socket cookie */
	__u8 addr[16];
	__be16 port;
	__u8 family;  /* LBD_FAMILY_V4 or LBD_FAMILY_V6 (v4-mapped peers are V4) */
	__u8 proto;
	__u32 pad;
};

/* The service the application addressed. */
struct sk_rev {
	__u8 vip[16];
	__be16 vport;
	__u8 family;
	__u8 pad;
	__u32 service_id;
	__u32 backend_id;
	__u32 pad2;
	__u64 created_ns; /* CLOCK_MONOTONIC */
};

/* An unconnected UDP socket's backend per service, so that its datagrams to one
 * service all go to one backend. */
struct sk_udp_key {
	__u64 cookie;
	__u8 vip[16];
	__be16 vport;
	__u8 family;
	__u8 pad;
	__u32 pad2;
};

struct sk_udp {
	__u32 backend_id;
	__u32 service_id;
};

/* Session affinity of local clients: a network namespace is the client. */
struct sk_aff_key {
	__u64 netns_cookie;
	__u32 service_id;
	__u32 pad;
};

struct sk_aff {
	__u64 last_seen_ns; /* CLOCK_MONOTONIC */
	__u32 backend_id;
	__u32 pad;
};

#endif
