/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Wire format shared by the LB-node (XDP) and backend-node (TC) programs.
 * docs/wire-format.md describes it; it interoperates with Cilium's DSR-Geneve dispatch. */
#ifndef LBD_WIRE_H
#define LBD_WIRE_H

#include <linux/types.h>

#define LBD_GENEVE_PORT 6081
#define LBD_GENEVE_DEFAULT_VNI 2
#define LBD_GENEVE_PROTO_ETH 0x6558 /* inner Ethernet frame follows */

/* Outer UDP source ports come from the inner flow hash, in this range. */
#define LBD_SPORT_MIN 32768
#define LBD_SPORT_RANGE 32768

/* The DSR option: class 0x014B, type 0x81 (critical bit set). */
#define LBD_OPT_CLASS 0x014B
#define LBD_OPT_TYPE 0x81
#define LBD_OPT_CRITICAL 0x80
#define LBD_OPT_LEN4_V4 2 /* 4-byte words after the option header: VIP(4) port(2) pad(2) */
#define LBD_OPT_LEN4_V6 5 /* VIP(16) port(2) pad(2) */

/* Every field falls on its natural alignment, so the structs need no packed
 * attribute (which would make clang read and write them byte by byte); the
 * asserts below hold the sizes to the wire. */
struct lbd_genevehdr {
	__u8 opt_len_ver; /* ver:2 (0) | opt_len:6 in 4-byte words, options only */
	__u8 flags;       /* O:1 C:1 rsvd:6 */
	__be16 proto;
	__be32 vni_rsvd;  /* VNI in the top 24 bits, then a reserved byte */
};

#define LBD_GENEVE_FLAG_OAM 0x80      /* O bit: a control packet */
#define LBD_GENEVE_FLAG_CRITICAL 0x40 /* C bit: an option has the critical bit set */

struct lbd_geneve_opthdr {
	__be16 opt_class;
	__u8 type;
	__u8 len; /* rsvd:3 | len:5 in 4-byte words, header excluded */
};

struct lbd_dsr_opt4 {
	struct lbd_geneve_opthdr hdr;
	__be32 vip;
	__be16 port;
	__u16 pad;
};

struct lbd_dsr_opt6 {
	struct lbd_geneve_opthdr hdr;
	__u8 vip[16];
	__be16 port;
	__u16 pad;
};

_Static_assert(sizeof(struct lbd_genevehdr) == 8, "geneve header");
_Static_assert(sizeof(struct lbd_geneve_opthdr) == 4, "geneve option header");
_Static_assert(sizeof(struct lbd_dsr_opt4) == 12 && sizeof(struct lbd_dsr_opt6) == 24, "dsr option");

/* Geneve header + one DSR option for an IPv4 VIP: 8 + 12 = 20 bytes; with outer
 * Ethernet(14, replaced) + IPv4(20) + UDP(8) + inner Ethernet(14) the packet grows by
 * 20 + 8 + 20 + 14 = 62 bytes, as docs/wire-format.md says. */
#define LBD_ENCAP_OVERHEAD_V4_V4 62

#endif
