/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Packet headers as the programs read them. The uapi <linux/ip.h> family pulls in
 * <asm/byteorder.h> and libc headers that only exist under the build host's multiarch
 * directory, so the few layouts needed are spelled out here. */
#ifndef LBD_BACKENDTC_HDR_H
#define LBD_BACKENDTC_HDR_H

#include <linux/types.h>

#define ETH_HLEN 14
#define ETH_P_IP 0x0800
#define ETH_P_IPV6 0x86DD

#define IPPROTO_ICMP 1
#define IPPROTO_TCP 6
#define IPPROTO_UDP 17
#define IPPROTO_ICMPV6 58

#define IP_MF 0x2000
#define IP_OFFSET 0x1fff

#define ICMP_DEST_UNREACH 3
#define ICMP_TIME_EXCEEDED 11
#define ICMP_PARAMETERPROB 12
#define ICMPV6_DEST_UNREACH 1
#define ICMPV6_PKT_TOOBIG 2
#define ICMPV6_TIME_EXCEED 3
#define ICMPV6_PARAMPROB 4

#define TCP_FLAG_FIN 0x01
#define TCP_FLAG_SYN 0x02
#define TCP_FLAG_RST 0x04
#define TCP_FLAG_ACK 0x10

struct ip4hdr {
	__u8 ver_ihl; /* version:4 (high) | ihl:4 in 4-byte words */
	__u8 tos;
	__be16 tot_len;
	__be16 id;
	__be16 frag_off; /* flags:3 | offset:13 */
	__u8 ttl;
	__u8 protocol;
	__be16 check;
	__be32 saddr;
	__be32 daddr;
};

struct ip6hdr {
	__be32 ver_tc_flow; /* version:4 (high) | traffic class:8 | flow label:20 */
	__be16 payload_len;
	__u8 nexthdr;
	__u8 hop_limit;
	__u8 saddr[16];
	__u8 daddr[16];
};

struct udp_hdr {
	__be16 source;
	__be16 dest;
	__be16 len;
	__be16 check;
};

struct tcp_hdr {
	__be16 source;
	__be16 dest;
	__be32 seq;
	__be32 ack_seq;
	__u8 doff;  /* data offset:4 (high) | reserved:4 */
	__u8 flags; /* CWR ECE URG ACK PSH RST SYN FIN */
	__be16 window;
	__be16 check;
	__be16 urg_ptr;
};

/* Common head of ICMP and ICMPv6 messages; errors quote the packet after it. */
struct icmp_hdr {
	__u8 type;
	__u8 code;
	__be16 check;
	__be32 rest;
};

#define IP4_VERSION(ip) ((ip)->ver_ihl >> 4)
#define IP4_HLEN(ip) (((ip)->ver_ihl & 0x0f) * 4)
#define IP6_VERSION(ip6) (((__u8 *)&(ip6)->ver_tc_flow)[0] >> 4)

#endif
