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

/* Write why the packet got its verdict into the metadata, which the packet
 * helpers kept in front of the (possibly moved) data. */
LBD_INLINE void lb_trace_record(struct xdp_md *ctx, const struct lb_pkt *pk)
{
	struct lb_trace_meta *tm = (void *)(long)ctx->data_meta;

	if ((void *)(tm + 1) > (void *)(long)ctx->data || tm->magic != LB_TRACE_MAGIC)
		return;
	tm->reason = pk->reason;
	tm->fib_rc = pk->fib_rc;
	tm->fib_done = pk->fib_done;
	tm->quic = pk->quic;
}

#endif
