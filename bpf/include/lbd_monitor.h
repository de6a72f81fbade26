/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* The packet monitor shared by lbxdp and backendtc (`lbctl monitor`): while the
 * daemon has a listener, packets worth reporting are sampled, rate-limited per CPU
 * and copied (their first LBD_MON_SNAPLEN bytes) into a ring buffer the daemon reads.
 * The program decides which packets qualify and copies their bytes (XDP and TC read
 * packets with different helpers); the layout, the switch, the sampler and the token
 * bucket are here. Its maps are not pinned: they belong to the daemon that loaded the
 * program, and a restarted daemon starts with the monitor off. */
#ifndef LBD_MONITOR_H
#define LBD_MONITOR_H

#include "lbd_net.h"

/* The daemon sets lbd_mon while at least one listener is connected and clears it when
 * the last one leaves: with flags 0 a packet pays one load and one branch. */
enum lbd_mon_flag {
	LBD_MON_REASONS = 1 << 0,   /* packets that hit a reason (drops, answers, passes) */
	LBD_MON_FORWARDED = 1 << 1, /* balanced packets (trace events; LB node only) */
};

/* Bytes of a packet an event carries at most. */
enum lbd_mon_snaplen {
	LBD_MON_SNAPLEN = 128,
};

/* Where the program that reported a packet runs; its reason and verdict are that
 * program's (enum lb_drop_reason and an XDP action, or enum counter and a tcx verdict). */
enum lbd_mon_hook {
	LBD_MON_HOOK_XDP,        /* lbxdp, an LB node's uplink */
	LBD_MON_HOOK_TC_INGRESS, /* backendtc's lbd_be_ingress */
	LBD_MON_HOOK_TC_EGRESS,  /* backendtc's lbd_be_egress */
};

struct lbd_mon_config {
	__u32 flags;  /* enum lbd_mon_flag; 0: off */
	__u32 sample; /* report one packet in this many that qualify (0 and 1: every one) */
	__u32 rate;   /* events a second and CPU at most, in bursts of up to as many */
	__u32 pad;
};

/* Per CPU (map lbd_mon_cpu): the sampler, the token bucket and what they held back. */
struct lbd_mon_state {
	__u64 refill_ns; /* when tokens were last added */
	__u32 tokens;
	__u32 skipped;   /* qualifying packets since the last sampled one */
	__u64 sent;
	__u64 sampled_out;
	__u64 rate_limited;
	__u64 ring_full;
};

/* One record of lbd_mon_ring: the packet as the program left it (a dropped one as it
 * arrived, an answered one as the answer, a forwarded one encapsulated). */
struct lbd_mon_event {
	__u64 time_ns;    /* CLOCK_MONOTONIC */
	__u32 ifindex;    /* the interface of the hook */
	__u32 len;        /* bytes of the frame */
	__u16 cap_len;    /* bytes of it in data */
	__u8 reason;      /* the program's reason (see enum lbd_mon_hook) */
	__u8 verdict;     /* the program's verdict, as a byte */
	__u8 hook;        /* enum lbd_mon_hook */
	__u8 pad[3];
	__u8 data[LBD_MON_SNAPLEN];
};

/* The enums above and the event's layout, generated for Go by bpf2go -type. */
struct lbd_mon_btf_types {
	enum lbd_mon_flag flag;
	enum lbd_mon_snaplen snaplen;
	enum lbd_mon_hook hook;
	struct lbd_mon_event event;
};
LBD_BTF_TYPES(lbd_mon_btf_types);

/* Written by the daemon through the mapped .bss; 0 flags: off. */
struct lbd_mon_config lbd_mon;

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct lbd_mon_state);
} lbd_mon_cpu SEC(".maps");

/* 256 KiB: about 1,600 events, a second of the default rate on 2 CPUs. */
struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 256 * 1024);
} lbd_mon_ring SEC(".maps");

/* Whether this CPU may send one more event: one in sample qualifying packets, and at
 * most rate a second (a token bucket as deep as a second's worth). */
LBD_INLINE int lbd_mon_admit(struct lbd_mon_state *st, __u32 sample, __u32 rate)
{
	__u64 now, elapsed, add;

	if (sample > 1 && ++st->skipped < sample) {
		st->sampled_out++;
		return 0;
	}
	st->skipped = 0;
	now = bpf_ktime_get_ns();
	elapsed = now - st->refill_ns;
	if (elapsed > LBD_NSEC_PER_SEC)
		elapsed = LBD_NSEC_PER_SEC;
	add = elapsed * rate / LBD_NSEC_PER_SEC;
	/* Without a whole token yet, refill_ns stays put so fractions add up. */
	if (add) {
		st->tokens += add;
		st->refill_ns = now;
	}
	/* Also takes a lowered rate at once. */
	if (st->tokens > rate)
		st->tokens = rate;
	if (!st->tokens) {
		st->rate_limited++;
		return 0;
	}
	st->tokens--;
	return 1;
}

/* How many bytes of a frame of len bytes an event carries. */
LBD_INLINE __u32 lbd_mon_caplen(__u32 len)
{
	return len < LBD_MON_SNAPLEN ? len : LBD_MON_SNAPLEN;
}

/* An event for a qualifying packet, its header filled but for cap_len, or NULL when
 * the sampler, the rate limit or a full ring holds it back (counted). The caller
 * copies the packet's first bytes into data, sets cap_len to how many it copied and
 * submits the event with bpf_ringbuf_submit. */
LBD_INLINE struct lbd_mon_event *lbd_mon_reserve(__u32 ifindex, __u32 len, __u32 reason, __u32 verdict,
						 __u32 hook)
{
	struct lbd_mon_event *ev;
	struct lbd_mon_state *st;
	__u32 zero = 0;

	st = bpf_map_lookup_elem(&lbd_mon_cpu, &zero);
	if (!st || !lbd_mon_admit(st, lbd_mon.sample, lbd_mon.rate))
		return NULL;
	ev = bpf_ringbuf_reserve(&lbd_mon_ring, sizeof(*ev), 0);
	if (!ev) {
		st->ring_full++;
		return NULL;
	}
	st->sent++;
	ev->time_ns = bpf_ktime_get_ns();
	ev->ifindex = ifindex;
	ev->len = len;
	ev->cap_len = 0;
	ev->reason = reason;
	ev->verdict = verdict;
	ev->hook = hook;
	ev->pad[0] = ev->pad[1] = ev->pad[2] = 0;
	return ev;
}

#endif
