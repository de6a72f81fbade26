/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Side-effect-free runs for `lbctl trace` (included by lbxdp.c): BPF_PROG_TEST_RUN
 * puts struct lb_trace_meta in front of the frame, and the program then writes no
 * conntrack, affinity or counter. */
#ifndef LBXDP_TRACE_H
#define LBXDP_TRACE_H

/* Whether the frame carries the trace metadata in front of it. */
LBD_INLINE int lb_trace_requested(struct xdp_md *ctx)
{
	void *meta = (void *)(long)ctx->data_meta;
	void *data = (void *)(long)ctx->data;
	struct lb_trace_meta *tm = meta;

	return (void *)(tm + 1) <= data && tm->magic == LB_TRACE_MAGIC;
}

#endif
