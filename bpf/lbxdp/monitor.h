/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* The packet monitor (included by lbxdp.c): while the daemon has a listener
 * (`lbctl monitor`), packets that hit a reason and, if asked, balanced packets
 * are sampled, rate-limited per CPU and copied (their first LB_MON_SNAPLEN
 * bytes) into a ring buffer the daemon reads. Its maps are not pinned: they
 * belong to the daemon that loaded the program, and a restarted daemon starts
 * with the monitor off. */
#ifndef LBXDP_MONITOR_H
#define LBXDP_MONITOR_H

/* Written by the daemon through the mapped .bss; 0 flags: off. */
struct lb_mon_config lb_mon;

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct lb_mon_state);
} lb_mon_cpu SEC(".maps");

/* 256 KiB: about 1,600 events, a second of the default rate on 2 CPUs. */
struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 256 * 1024);
} lb_mon_ring SEC(".maps");

/* Whether this CPU may send one more event: one in mc->sample qualifying
 * packets, and at most mc->rate a second (a token bucket as deep as a second's
 * worth). */
LBD_INLINE int lb_mon_admit(struct lb_mon_state *st, __u32 sample, __u32 rate)
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

/* Report the packet if the monitor wants it. Runs after the verdict, so the
 * bytes are the packet as the program left it. A global function: the verifier
 * checks it once, not once per path that reaches it. */
__attribute__((noinline)) int lb_monitor(struct xdp_md *ctx, __u32 reason, __u32 verdict)
{
	struct lb_mon_event *ev;
	struct lb_mon_state *st;
	__u32 zero = 0, len, cap;

	if (reason == LB_REASON_NONE) {
		/* Not balanced (passed to the kernel, not for a VIP) or not asked for. */
		if (!(lb_mon.flags & LB_MON_FORWARDED) || (verdict != XDP_TX && verdict != XDP_REDIRECT))
			return 0;
	} else if (!(lb_mon.flags & LB_MON_REASONS)) {
		return 0;
	}
	st = bpf_map_lookup_elem(&lb_mon_cpu, &zero);
	if (!st || !lb_mon_admit(st, lb_mon.sample, lb_mon.rate))
		return 0;
	ev = bpf_ringbuf_reserve(&lb_mon_ring, sizeof(*ev), 0);
	if (!ev) {
		st->ring_full++;
		return 0;
	}
	len = bpf_xdp_get_buff_len(ctx);
	cap = len < LB_MON_SNAPLEN ? len : LB_MON_SNAPLEN;
	ev->time_ns = bpf_ktime_get_ns();
	ev->ifindex = ctx->ingress_ifindex;
	ev->len = len;
	ev->reason = reason;
	ev->verdict = verdict;
	ev->pad = 0;
	if (cap == 0 || bpf_xdp_load_bytes(ctx, 0, ev->data, cap))
		cap = 0;
	ev->cap_len = cap;
	bpf_ringbuf_submit(ev, 0);
	st->sent++;
	return 0;
}

#endif
