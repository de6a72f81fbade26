/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* The packet monitor (included by lbxdp.c; the shared part is lbd_monitor.h): while
 * the daemon has a listener (`lbctl monitor`), packets that hit a reason and, if
 * asked, balanced packets are reported. */
#ifndef LBXDP_MONITOR_H
#define LBXDP_MONITOR_H

#include "lbd_monitor.h"

/* Report the packet if the monitor wants it. Runs after the verdict, so the
 * bytes are the packet as the program left it. A global function: the verifier
 * checks it once, not once per path that reaches it. */
__attribute__((noinline)) int lb_monitor(struct xdp_md *ctx, __u32 reason, __u32 verdict)
{
	struct lbd_mon_event *ev;
	__u32 len, cap;

	if (reason == LB_REASON_NONE) {
		/* Not balanced (passed to the kernel, not for a VIP) or not asked for. */
		if (!(lbd_mon.flags & LBD_MON_FORWARDED) || (verdict != XDP_TX && verdict != XDP_REDIRECT))
			return 0;
	} else if (!(lbd_mon.flags & LBD_MON_REASONS)) {
		return 0;
	}
	len = bpf_xdp_get_buff_len(ctx);
	ev = lbd_mon_reserve(ctx->ingress_ifindex, len, reason, verdict, LBD_MON_HOOK_XDP);
	if (!ev)
		return 0;
	cap = lbd_mon_caplen(len);
	if (cap == 0 || bpf_xdp_load_bytes(ctx, 0, ev->data, cap))
		cap = 0;
	ev->cap_len = cap;
	bpf_ringbuf_submit(ev, 0);
	return 0;
}

#endif
