/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Protocol headers and constants for the lbd BPF programs.
 *
 * Defined here rather than taken from <linux/ip.h> and friends: those pull in libc
 * and host-architecture headers that a BPF build must not depend on. Only
 * <linux/bpf.h> (for contexts, helpers and enums) is taken from the system. */
#ifndef LBD_NET_H
#define LBD_NET_H

#include <linux/types.h>
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#define LBD_INLINE static __always_inline
#define lbd_likely(x) __builtin_expect(!!(x), 1)
#define lbd_unlikely(x) __builtin_expect(!!(x), 0)

/* Defines the global `name` of type struct name in a section of its own, to put the
 * struct's member types into the object's BTF, where bpf2go -type finds them and
 * generates their Go equivalents. An enum whose constants are only values (a __u8
 * field, an index of a per-CPU array) reaches BTF through nothing else. The section
 * holds no code and is no map: the loader skips it, the programs do not change. */
#define LBD_BTF_TYPES(name) struct name name __attribute__((section(".lbd.btf"), used))

#define LBD_NSEC_PER_SEC 1000000000ULL

/* Error numbers map helpers return (negated), as in <asm-generic/errno-base.h>. */
#define LBD_EEXIST 17

#define LBD_ETH_ALEN 6
#define LBD_ETH_HLEN 14
#define LBD_VLAN_HLEN 4
#define LBD_ETH_P_IP 0x0800
#define LBD_ETH_P_IPV6 0x86DD
#define LBD_ETH_P_8021Q 0x8100
#define LBD_ETH_P_8021AD 0x88A8

#define LBD_IPPROTO_HOPOPTS 0
#define LBD_IPPROTO_ICMP 1
#define LBD_IPPROTO_TCP 6
#define LBD_IPPROTO_UDP 17
#define LBD_IPPROTO_ROUTING 43
#define LBD_IPPROTO_FRAGMENT 44
#define LBD_IPPROTO_AH 51
#define LBD_IPPROTO_ICMPV6 58
#define LBD_IPPROTO_DSTOPTS 60
#define LBD_IPPROTO_SCTP 132

/* Address families as stored in lbd map keys (not AF_* values: these are smaller
 * and spell out the IP version). */
#define LBD_FAMILY_V4 4
#define LBD_FAMILY_V6 6

#define LBD_IP_DF 0x4000
#define LBD_IP_MF 0x2000
#define LBD_IP_OFFMASK 0x1FFF

#define LBD_TCP_FIN 0x01
#define LBD_TCP_SYN 0x02
#define LBD_TCP_RST 0x04
#define LBD_TCP_PSH 0x08
#define LBD_TCP_ACK 0x10

#define LBD_ICMP_DEST_UNREACH 3
#define LBD_ICMP_TIME_EXCEEDED 11
#define LBD_ICMP_PARAMETERPROB 12
#define LBD_ICMP_PORT_UNREACH 3 /* code */
#define LBD_ICMP_FRAG_NEEDED 4  /* code */

#define LBD_ICMP6_DEST_UNREACH 1
#define LBD_ICMP6_PKT_TOOBIG 2
#define LBD_ICMP6_TIME_EXCEED 3
#define LBD_ICMP6_PARAMPROB 4
#define LBD_ICMP6_PORT_UNREACH 4 /* code */
#define LBD_ICMP6_ND_FIRST 133   /* router solicitation ... */
#define LBD_ICMP6_ND_LAST 137    /* ... redirect */

struct lbd_ethhdr {
	__u8 dst[LBD_ETH_ALEN];
	__u8 src[LBD_ETH_ALEN];
	__be16 proto;
};

struct lbd_vlanhdr {
	__be16 tci;
	__be16 proto;
};

struct lbd_iphdr {
	__u8 ver_ihl; /* version:4 | ihl:4 */
	__u8 tos;
	__be16 tot_len;
	__be16 id;
	__be16 frag_off;
	__u8 ttl;
	__u8 protocol;
	__sum16 check;
	__be32 saddr;
	__be32 daddr;
};

struct lbd_ipv6hdr {
	__be32 ver_tc_flow; /* version:4 | traffic class:8 | flow label:20 */
	__be16 payload_len;
	__u8 nexthdr;
	__u8 hop_limit;
	__u8 saddr[16];
	__u8 daddr[16];
};

struct lbd_ipv6_opthdr {
	__u8 nexthdr;
	__u8 hdrlen;
};

struct lbd_ipv6_fraghdr {
	__u8 nexthdr;
	__u8 reserved;
	__be16 frag_off; /* offset:13 | res:2 | M:1 */
	__be32 id;
};

struct lbd_tcphdr {
	__be16 source;
	__be16 dest;
	__be32 seq;
	__be32 ack_seq;
	__u8 doff_res; /* data offset:4 | reserved:4 */
	__u8 flags;
	__be16 window;
	__sum16 check;
	__be16 urg_ptr;
};

struct lbd_udphdr {
	__be16 source;
	__be16 dest;
	__be16 len;
	__sum16 check;
};

/* SCTP common header (RFC 9260 §3.1), then its first chunk's header. The CRC32c
 * covers the SCTP packet alone, no pseudo-header: an address change leaves it
 * valid, a port change would not. */
struct lbd_sctphdr {
	__be16 source;
	__be16 dest;
	__be32 vtag;
	__le32 crc;
};

struct lbd_sctp_chunkhdr {
	__u8 type;
	__u8 flags;
	__be16 len;
};

/* SCTP chunk types that move an association's state (RFC 9260 §3.2). */
#define LBD_SCTP_DATA 0
#define LBD_SCTP_INIT 1
#define LBD_SCTP_INIT_ACK 2
#define LBD_SCTP_ABORT 6
#define LBD_SCTP_SHUTDOWN 7
#define LBD_SCTP_SHUTDOWN_ACK 8
#define LBD_SCTP_COOKIE_ECHO 10
#define LBD_SCTP_SHUTDOWN_COMPLETE 14

/* ICMP and ICMPv6 share this layout: type, code, checksum, 4 bytes of
 * type-specific data (the next-hop MTU of "fragmentation needed" sits in the low
 * 16 bits; ICMPv6 "packet too big" uses all 32). */
struct lbd_icmphdr {
	__u8 type;
	__u8 code;
	__sum16 check;
	__be32 un;
};

/* The structs above have no implicit padding, so they are not marked packed:
 * packed would make clang emit byte-wise loads and stores for every field. */
LBD_INLINE __u8 lbd_ip4_version(const struct lbd_iphdr *ip) { return ip->ver_ihl >> 4; }

/* IPv4 header length in bytes, options included. */
LBD_INLINE __u32 lbd_ip4_hlen(const struct lbd_iphdr *ip) { return (ip->ver_ihl & 0x0f) * 4; }

LBD_INLINE __u8 lbd_ip6_version(const struct lbd_ipv6hdr *ip6) { return ((const __u8 *)ip6)[0] >> 4; }

/* Whether two 16-byte addresses (lbd's map form: IPv4 in the first four bytes)
 * are equal, in four word compares and no branch per word. */
LBD_INLINE int lbd_addr_eq(const __u8 *a, const __u8 *b)
{
	const __u32 *x = (const __u32 *)a, *y = (const __u32 *)b;

	return !((x[0] ^ y[0]) | (x[1] ^ y[1]) | (x[2] ^ y[2]) | (x[3] ^ y[3]));
}

_Static_assert(sizeof(struct lbd_ethhdr) == 14, "ethhdr");
_Static_assert(sizeof(struct lbd_iphdr) == 20, "iphdr");
_Static_assert(sizeof(struct lbd_ipv6hdr) == 40, "ipv6hdr");
_Static_assert(sizeof(struct lbd_tcphdr) == 20, "tcphdr");
_Static_assert(sizeof(struct lbd_udphdr) == 8, "udphdr");
_Static_assert(sizeof(struct lbd_icmphdr) == 8, "icmphdr");
_Static_assert(sizeof(struct lbd_sctphdr) == 12, "sctphdr");
_Static_assert(sizeof(struct lbd_ipv6_fraghdr) == 8, "fraghdr");

#endif
