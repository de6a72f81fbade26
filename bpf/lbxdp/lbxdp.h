/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Map layouts and enums of the LB-node XDP program, generated for Go by bpf2go
 * -type (gen.go). Addresses are 16 bytes with IPv4 in the first four and zeros
 * after, so one key layout serves both families. */
#ifndef LBXDP_H
#define LBXDP_H

#include "lbd_net.h"

/* Map sizes compiled into the object. The Go package sizes every map at load time
 * (lbxdp.Options), and these are its defaults (generated for it, lb_btf_types); lbd
 * sizes the ID-indexed maps from its store's limits (daemon/lbd/datapathcfg.go). */
enum lb_default {
	LB_DEFAULT_MAX_SERVICES = 4096,  /* service IDs 0..4095 */
	LB_DEFAULT_MAX_BACKENDS = 65536, /* backend IDs 1..65535 */
	LB_DEFAULT_CT_FLOWS = 1 << 20,   /* flows conntrack is sized for */
	LB_DEFAULT_AFF_SIZE = 65536,
	LB_DEFAULT_SRC_SIZE = 16384,
};
/* The conntrack maps hold a quarter more than their flows: headroom for new flows
 * while the collector has not yet reclaimed the excess (lbxdp.ConntrackEntries). */
#define LB_DEFAULT_CT_SIZE (LB_DEFAULT_CT_FLOWS + LB_DEFAULT_CT_FLOWS / 4)

/* Service flags. */
enum lb_svc_flag {
	LB_SVC_HASH_SRC = 1 << 0,     /* Maglev index from the client address only */
	LB_SVC_DROP_NO_BE = 1 << 1,   /* no backend: drop silently instead of rejecting */
	LB_SVC_SRC_RANGES = 1 << 2,   /* only sources in lb_src_ranges may connect */
	LB_SVC_AFFINITY = 1 << 3,     /* session affinity by client address */
	LB_SVC_QUIC = 1 << 4,         /* UDP: route QUIC by the server ID in the connection ID */
};

/* Why a packet left the forwarding path (index of lb_drop_stats). A "reject" or
 * "too big" packet is dropped but answered; LB_PASS_NO_NEIGH is forwarded through
 * the kernel. Append new reasons before LB_DROP_MAX: the Go package names each one
 * (lb_btf_types below). */
enum lb_drop_reason {
	LB_DROP_MALFORMED = 0,     /* headers truncated or inconsistent */
	LB_DROP_FRAGMENT,          /* IP fragment of VIP traffic */
	LB_DROP_SRC_RANGE,         /* source outside the service's allowed ranges */
	LB_DROP_NO_BACKEND,        /* no usable backend, service asks to drop */
	LB_DROP_REJECTED,          /* no usable backend, answered with RST / unreachable */
	LB_DROP_TOO_BIG,           /* would exceed the egress MTU, answered with ICMP */
	LB_DROP_TOO_BIG_UNSIGNALED, /* would exceed the MTU, no ICMP possible (no DF, ICMP error) */
	LB_DROP_FIB,               /* FIB lookup failed for another reason than those below */
	LB_DROP_INTERNAL,          /* a packet-resizing helper failed */
	LB_DROP_FIB_NO_ROUTE,      /* no route (or an unreachable one) toward the backend node */
	LB_PASS_NO_NEIGH,          /* next hop unresolved: encapsulated, passed to the kernel */
	LB_DROP_NO_SERVICE,        /* for a VIP, but no service on its port and protocol */
	LB_DROP_EXTHDRS,           /* IPv6 to a VIP with more extension headers than lbd follows */
	LB_DROP_MAX,
	LB_REASON_NONE = 0xff,     /* lb_trace_meta.reason of a packet that hit no reason above */
};

/* How a packet of a QUIC service was routed (index of the per-CPU lb_quic_stats, and
 * lb_trace_meta.quic). Append before LB_QUIC_MAX: the Go package names each one. */
enum lb_quic_route {
	LB_QUIC_NONE = 0,      /* not a QUIC service's packet */
	LB_QUIC_ROUTED,        /* by the server ID in its destination connection ID */
	LB_QUIC_CLIENT_CID,    /* a long header with a client-chosen ID (Initial, 0-RTT, an
				* unknown version): the 5-tuple and Maglev, by design */
	LB_QUIC_UNKNOWN_ID,    /* another config rotation (unroutable 0b111 included), or a
				* server ID no backend of the service has: the 5-tuple */
	LB_QUIC_MALFORMED,     /* too short for a connection ID of the configured form, or a
				* long header no client sends: the 5-tuple */
	LB_QUIC_MAX,
};

/* lb_quic_sids: the backend of a server ID, per service. The ID fills sid[0..len),
 * zeros after. */
enum lb_quic_sid {
	LB_QUIC_SID_MAX = 15,
};
struct lb_quic_key {
	__u32 service_id;
	__u8 sid[16];
};

/* State of a conntrack entry, from TCP flags or SCTP chunk types; selects its
 * timeout. The LB node sees the client's packets only (replies go straight back). */
enum lb_ct_state {
	LB_CT_OTHER = 0,   /* UDP: idle timeout */
	LB_CT_SYN = 1,     /* SYN seen, no ACK yet */
	LB_CT_ESTABLISHED = 2,
	LB_CT_CLOSING = 3, /* FIN or RST seen: short timeout; a new SYN re-balances */
	LB_CT_SCTP_INIT = 4,        /* INIT seen */
	LB_CT_SCTP_COOKIE = 5,      /* COOKIE ECHO seen: the handshake's last step */
	LB_CT_SCTP_ESTABLISHED = 6, /* any other chunk after the handshake */
	LB_CT_SCTP_SHUTDOWN = 7,    /* SHUTDOWN or SHUTDOWN ACK seen */
	LB_CT_SCTP_CLOSED = 8,      /* ABORT or SHUTDOWN COMPLETE seen: a new INIT re-balances */
};

struct lb_vip_key {
	__u8 addr[16];
	__u8 family;
	__u8 pad[3];
};

/* Number of services on a VIP address, and how many of them take all ports. */
struct lb_vip {
	__u32 services;
	__u16 wild_tcp;
	__u16 wild_udp;
	__u16 wild_sctp;
	__u16 pad;
};

struct lb_service_key {
	__u8 addr[16];
	__be16 port; /* 0: all ports */
	__u8 proto;
	__u8 family;
};

struct lb_service {
	__u32 id;               /* stable; indexes lb_tables and lb_svc_stats */
	__u32 flags;            /* enum lb_svc_flag */
	__u32 affinity_timeout; /* seconds */
	/* LB_SVC_QUIC (QUIC-LB plaintext CIDs, quic.h): the config rotation bits its
	 * server IDs are valid under, and the server ID's length in bytes (1-15). */
	__u8 quic_config_id;
	__u8 quic_sid_len;
	__u16 pad;
};

struct lb_backend {
	__u8 addr[16];
	__u8 node_addr[16]; /* outer destination */
	__be16 port;        /* 0: keep the client's destination port */
	__u8 family;        /* 0: slot unused */
	__u8 node_family;
};

/* The flow of a packet (client -> VIP as received), the key of lb_ct6. */
struct lb_ct_key {
	__u8 saddr[16]; /* client */
	__u8 daddr[16]; /* VIP */
	__be16 sport;
	__be16 dport;
	__u8 proto;
	__u8 family;
	__u16 pad;
};

/* The key of lb_ct4: an IPv4 flow in 16 bytes rather than lb_ct_key's 40, which
 * makes the entry a quarter smaller and its insert and lookup cheaper. */
struct lb_ct4_key {
	__be32 saddr;
	__be32 daddr;
	__be16 sport;
	__be16 dport;
	__u8 proto;
	__u8 pad[3];
};

/* Conntrack value (lb_ct4 and lb_ct6): 16 bytes, so that a million flows stay in a few hundred
 * megabytes and an insert copies little. Times are whole seconds of
 * CLOCK_MONOTONIC (struct lb_clock); an entry expires when it has been idle
 * longer than the timeout of its state (lb_ct_timeout), which the config
 * holds, so a timeout change applies to every entry at once. */
struct lb_ct {
	__u32 backend_id;
	__u32 service_id;
	__u32 last_seen; /* seconds; rewritten at most once a second per flow */
	/* Low 16 bits of the flow hash: the outer source port and flow label of the
	 * flow's packets, rewritten with last_seen (a new seed applies within a
	 * second). 0 in an entry restored from user space: computed per packet. */
	__u16 hash;
	__u8 state; /* enum lb_ct_state */
	__u8 flags; /* enum lb_ct_flag */
};

/* lb_ct.flags. */
enum lb_ct_flag {
	/* Created by a packet other than a TCP SYN (a mid-connection TCP packet, the
	 * first UDP datagram): the short tentative timeout applies until another
	 * packet of the flow confirms it. A flood of spoofed sources sends one packet
	 * per source and never confirms its entries. */
	LB_CT_F_TENTATIVE = 1 << 0,
};

/* What conntrack did (index of the per-CPU lb_ct_stats). Append before
 * LB_CT_EV_MAX: the Go package names each one. */
enum lb_ct_event {
	LB_CT_EV_INSERTED = 0,  /* a new flow got an entry */
	LB_CT_EV_TENTATIVE,     /* ... of which a tentative one */
	LB_CT_EV_CONFIRMED,     /* a tentative entry was confirmed by a later packet */
	LB_CT_EV_GUARD_SKIPPED, /* a new flow was balanced but got no entry: over the guard rate */
	LB_CT_EV_GUARD_ENGAGED, /* a CPU's guard started skipping (at most once a second) */
	LB_CT_EV_INSERT_FAILED, /* no entry could be written (table full): balanced, untracked */
	LB_CT_EV_MAX,
};

/* lb_svc_by_id: every service by ID, with its key. A packet whose conntrack
 * entry names a service that still has exactly the packet's destination as
 * key (port included: wildcard services are not in the shortcut) needs no
 * lb_vips and lb_services lookups. family 0: no service has this ID. */
struct lb_svc_entry {
	struct lb_service_key key;
	struct lb_service svc;
};

/* lb_vip_filter: one bit per bucket of destination addresses, set when a VIP
 * address falls in the bucket (lb_vip_bucket). A clear bit proves that a
 * packet is not for a VIP without a hash map lookup; a set bit is confirmed
 * by lb_vips. The control plane sets a bit before adding the VIP and clears
 * it after removing it. */
enum lb_vip_filter_order {
	LB_VIP_FILTER_ORDER = 16,
};
#define LB_VIP_FILTER_BYTES (1 << (LB_VIP_FILTER_ORDER - 3))
#define LB_VIP_FILTER_MUL 0x9e3779b1U
struct lb_vip_bitmap {
	__u8 bits[LB_VIP_FILTER_BYTES];
};

struct lb_aff_key {
	__u32 service_id;
	__u8 family;
	__u8 pad[3];
	__u8 addr[16];
};

struct lb_aff {
	__u64 last_seen_ns;
	__u32 backend_id;
	__u32 pad;
};

/* LPM key: prefixlen counts service_id (32), family+pad (32), then address bits. */
struct lb_src_key {
	__u32 prefixlen;
	__u32 service_id;
	__u8 family;
	__u8 pad[3];
	__u8 addr[16];
};

struct lb_counter {
	__u64 packets;
	__u64 bytes;
	__u64 new_flows;
};

struct lb_config {
	__u32 hash_seed;
	__u32 vni;
	__u8 src4[4];  /* outer IPv4 source; zero: ask the FIB */
	__u8 src6[16]; /* outer IPv6 source; zero: ask the FIB */
	__u32 tcp_syn_timeout;   /* seconds */
	__u32 tcp_est_timeout;
	__u32 tcp_close_timeout;
	__u32 udp_timeout;
	__u32 route_gen; /* bumped to invalidate every cached FIB result */
	__u32 tentative_timeout; /* seconds, of an entry with LB_CT_F_TENTATIVE */
	/* New flows a second and CPU that get a conntrack entry; past it new flows
	 * are balanced by Maglev alone (lb_ct_admit). 0: no limit. */
	__u32 ct_guard_rate;
	__u32 sctp_init_timeout;  /* seconds: INIT or COOKIE ECHO seen */
	__u32 sctp_est_timeout;
	__u32 sctp_close_timeout; /* SHUTDOWN, ABORT or SHUTDOWN COMPLETE seen */
};

/* Metadata (data_meta) asking for a side-effect-free run: no conntrack,
 * affinity or counter writes. The Go package's Trace puts it in front of a
 * BPF_PROG_TEST_RUN frame; drivers leave data_meta empty. The program writes
 * back why the packet got its verdict, so a trace reports what the datapath
 * did rather than a guess. */
enum lb_trace_magic {
	LB_TRACE_MAGIC = 0x6c626474, /* "lbdt" */
};
struct lb_trace_meta {
	__u32 magic;
	__u8 reason; /* enum lb_drop_reason, or LB_REASON_NONE */
	__u8 fib_rc; /* last bpf_fib_lookup result (BPF_FIB_LKUP_RET_*) */
	__u8 fib_done; /* 1: a FIB lookup ran (fib_rc is meaningful) */
	__u8 quic;     /* enum lb_quic_route */
};

/* A FIB result toward a backend's node, cached per CPU and per backend ID: a
 * FIB lookup costs about as much as the rest of the fast path. The entry is
 * used only for the node, ingress port and time it was resolved for; failures
 * are never cached. Route or neighbour changes take effect within
 * LB_FIB_CACHE_NS, or at once when the control plane bumps route_gen. */
struct lb_route {
	__u64 expires_ns; /* coarse monotonic clock; 0: empty */
	__u8 node[16];
	__u32 ingress;    /* ingress ifindex the lookup was made for */
	__u32 ifindex;    /* egress */
	__u32 mtu;        /* route MTU toward the node */
	__u32 gen;        /* lb_config.route_gen it was resolved under */
	__u8 smac[LBD_ETH_ALEN];
	__u8 dmac[LBD_ETH_ALEN];
	__u8 src[16];     /* outer source address */
};

/* The coarse clock as of a jiffy, per CPU: bpf_jiffies64 is inlined by the
 * verifier, bpf_ktime_get_coarse_ns is a helper call, and both advance on
 * the timer tick, so the clock is read once per tick and CPU. */
struct lb_clock {
	__u64 jiffies;
	__u64 ns;
	__u32 sec;         /* ns in whole seconds */
	/* The flood guard of this CPU (lb_ct_admit): new flows admitted in second
	 * guard_sec. */
	__u32 guard_sec;
	__u32 guard_flows;
	__u32 pad;
};

/* The enums above, and the layouts of what is not a map's key or value, generated for
 * Go by bpf2go -type (lbxdp_bpfel.go); the Go package names each value of the enums
 * it reports in a table keyed by the generated constants, and its tests fail on a
 * value without a name. */
struct lb_btf_types {
	enum lb_svc_flag svc_flag;
	enum lb_drop_reason drop_reason;
	enum lb_quic_route quic_route;
	enum lb_ct_state ct_state;
	enum lb_ct_flag ct_flag;
	enum lb_ct_event ct_event;
	enum lb_default defaults;
	enum lb_quic_sid quic_sid;
	enum lb_trace_magic trace_magic;
	enum lb_vip_filter_order vip_filter_order;
	struct lb_trace_meta trace_meta;
};
LBD_BTF_TYPES(lb_btf_types);

#endif
