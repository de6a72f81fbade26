/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Maps, map types and constants of the backend-node TC programs. The Go package
 * backendtc mirrors these layouts (through bpf2go -type) and the counter order. */
#ifndef LBD_BACKENDTC_H
#define LBD_BACKENDTC_H

#include "lbd_net.h"

/* tcx verdicts; Debian's 6.1 uapi headers predate tcx, so they are spelled here. */
#define LBD_TCX_NEXT -1
#define LBD_TCX_DROP 2

/* Missing from the 6.1 uapi headers (docs/testing.md); own names so that newer headers,
 * which declare them in an enum, do not clash. */
#define LBD_ADJ_ROOM_DECAP_L3_IPV4 (1ULL << 7)
#define LBD_ADJ_ROOM_DECAP_L3_IPV6 (1ULL << 8)

/* Non-critical options are skipped; a Geneve header with more options than this
 * is refused rather than walked, so the loop stays short. */
#define LBD_MAX_GENEVE_OPTS 8

/* last_seen is rewritten at most this often per entry, so that ingress and egress
 * CPUs do not bounce the cache line on every packet. The GC works in seconds. */
#define LBD_NAT_TOUCH_NS LBD_NSEC_PER_SEC

/* nat_val.flags */
#define LBD_NAT_F_CLOSING 0x1 /* a FIN or RST (SCTP: ABORT, SHUTDOWN, SHUTDOWN COMPLETE)
			       * was seen: the GC uses the short timeout */

/* Allowed LB sources: IPv4 is stored IPv4-mapped (::ffff:a.b.c.d) with prefixlen+96,
 * so one trie serves both families. */
struct lpm_key {
	__u32 prefixlen;
	__u8 addr[16];
};

/* One direction-agnostic NAT entry per backend flow. Addresses are 16 bytes; an IPv4
 * address fills the first 4 and the rest is zero. Ports are in network order. */
struct nat_key {
	__u8 backend[16];
	__u8 client[16];
	__be16 backend_port;
	__be16 client_port;
	__u8 proto;
	__u8 family; /* LBD_FAMILY_V4 or LBD_FAMILY_V6 */
	__u8 pad[2];
};

struct nat_val {
	__u8 vip[16];
	__be16 vip_port;
	__u8 family;
	__u8 flags;      /* LBD_NAT_F_* */
	__u32 pad;
	__u64 last_seen; /* bpf_ktime_get_boot_ns() (CLOCK_BOOTTIME) of the last packet */
};

struct config {
	__u32 vni; /* Geneve VNI accepted on ingress */
	__u32 pad;
};

/* Per-CPU counters, indexed by reason. The Go package lists them in this order; the
 * drops come last, from CNT_DROP_NOT_ALLOWED on (its tests rely on it). Ingress
 * judges a Geneve packet lbd's when its header is version 0 with the configured VNI
 * and its options hold lbd's DSR option (decap.h); only lbd's packets are dropped. */
enum counter {
	CNT_DECAP_OK,              /* lbd's packet decapsulated */
	CNT_DECAP_NO_NAT,          /* ... and it had no ports (ICMP, a later fragment) */
	CNT_NAT_CREATED,
	CNT_NAT_REFRESHED,
	CNT_NAT_REPLACED,
	CNT_NAT_CLOSING,
	CNT_SNAT_DONE,
	CNT_ICMP_TRANSLATED,
	CNT_PASS_FRAGMENT,         /* a first fragment to the Geneve port: passed, unjudged */
	CNT_PASS_FOREIGN,          /* UDP to the Geneve port that is not lbd's Geneve (no DSR
				    * option, another VNI, another version) or cannot be read
				    * far enough to tell: passed to the kernel unchanged */
	CNT_DROP_NOT_ALLOWED,      /* lbd's option from a source outside the allowed LBs */
	CNT_DROP_MALFORMED_OPT,    /* lbd's option of a wrong length or padding, repeated, or
				    * in an option area that cannot be walked to its end */
	CNT_DROP_UNKNOWN_CRITICAL, /* lbd's option next to a critical option lbd does not know */
	CNT_DROP_BAD_LEN,          /* lbd's packet too short for its inner frame, or lengths
				    * of the inner packet inconsistent */
	CNT_DROP_BAD_GENEVE,       /* lbd's option in a control packet or around no Ethernet frame */
	CNT_DROP_BAD_INNER,        /* the inner packet is not an IP packet of the VIP's family */
	CNT_DROP_DECAP_FAILED,
	CNT_DROP_NAT_FAILED,
	CNT_DROP_SNAT_FAILED,
	CNT_MAX,
};

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, 1024);
	__type(key, struct lpm_key);
	__type(value, __u8);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} betc_allowed SEC(".maps");

/* LRU so that a full table evicts the stalest flow instead of refusing new ones;
 * the size is set at load time by the Go package. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 262144);
	__type(key, struct nat_key);
	__type(value, struct nat_val);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} betc_nat SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, CNT_MAX);
	__type(key, __u32);
	__type(value, __u64);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} betc_counters SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct config);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} betc_config SEC(".maps");

#endif
