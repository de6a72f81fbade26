// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
//go:build ignore

/* A packet injector for tests and benchmarks, run by BPF_PROG_RUN with
 * BPF_F_TEST_XDP_LIVE_FRAMES: every run writes one frame from a template and
 * returns XDP_TX, which the kernel turns into a transmission out of the
 * context's ingress interface. And a counter, attached where the frames arrive.
 *
 * The kernel feeds the program pages from a page pool that it recycles without
 * re-initialising them, and a frame that went out by a veth comes back to the
 * pool as its receiver left it: DNAT'ed, encapsulated, shifted. So every run
 * writes the whole template again before it edits the flow's fields. */
#include "lbd_net.h"
#include "lbd_csum.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

/* Largest template: a 1500-byte IP packet in an untagged Ethernet frame. */
#define XG_MAX 1514

/* Offsets in the template, which is untagged Ethernet, IPv4 without options,
 * then TCP or UDP: the Go side refuses any other. */
#define XG_IP_OFF LBD_ETH_HLEN
#define XG_L4_OFF (XG_IP_OFF + 20)

enum xg_mode {
	XG_ONE_FLOW = 0,  /* the template every time */
	XG_NEW_FLOW = 1,  /* packet n is flow n */
	XG_SYN_ACK = 2,   /* packets 2n and 2n+1 are flow n: its SYN, then an ACK */
};

struct xg_config {
	__u32 len;       /* bytes of the template in use: the frame's length */
	__u32 mode;      /* enum xg_mode */
	__u32 addrs;     /* source addresses, counted up from the template's (>= 1) */
	__u32 ports;     /* source ports, counted up from the template's (>= 1) */
	__u64 limit;     /* runs beyond this sequence number send nothing */
	/* Nonzero: send only while fewer frames than this, of those sent since
	 * seq_base, are missing from the count of arrivals since arrived_base. */
	__u64 window;
	__u64 seq_base;
	__u64 arrived_base;
	__u8 data[XG_MAX];
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct xg_config);
} xg_cfg SEC(".maps");

/* Not per CPU: BPF_PROG_RUN may move to another CPU between batches, and the
 * sequence must stay one sequence. Only one sender runs at a time (the Go side
 * holds a lock), so the increments need no atomics. */
struct xg_state {
	__u64 seq;      /* runs that sent a frame */
	__u64 over;     /* runs past the limit, which sent nothing */
	__u64 waits;    /* runs that sent nothing: the window was full */
	__u64 first_ns; /* when the frame numbered seq_base was sent */
	__u64 last_ns;  /* when the frame numbered limit - 1 was sent */
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct xg_state);
} xg_seq SEC(".maps");

/* Frames the counters of a pacer saw arrive. The Go side gives an injector and
 * its counters one map, so that the injector can keep a window of frames in
 * flight: a sender that waits for arrivals can offer any forwarder every frame
 * without overflowing its queues, in one BPF_PROG_RUN call. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} xg_arrived SEC(".maps");

SEC("xdp")
int xg_send(struct xdp_md *ctx)
{
	struct xg_config *c;
	struct xg_state *s;
	struct lbd_iphdr *ip;
	void *data, *data_end;
	__u32 zero = 0, len;
	__u64 n, flow;
	__be32 saddr, nsaddr;
	__be16 sport, nsport;
	__u64 ipdiff, l4diff;

	c = bpf_map_lookup_elem(&xg_cfg, &zero);
	s = bpf_map_lookup_elem(&xg_seq, &zero);
	if (!c || !s)
		return XDP_ABORTED;
	/* The caller asks for a number of frames; a run that BPF_PROG_RUN repeats
	 * after an interruption must not send more. */
	if (s->seq >= c->limit) {
		s->over++;
		return XDP_DROP;
	}
	if (c->window) {
		__u64 *arrived = bpf_map_lookup_elem(&xg_arrived, &zero);
		__u64 got;

		if (!arrived)
			return XDP_ABORTED;
		got = *(volatile __u64 *)arrived - c->arrived_base;
		/* Signed: other traffic the counters saw may put arrivals ahead. */
		if ((__s64)(s->seq - c->seq_base - got) >= (__s64)c->window) {
			s->waits++;
			return XDP_DROP;
		}
	}
	len = c->len;
	if (len < XG_L4_OFF + sizeof(struct lbd_udphdr) || len > XG_MAX)
		return XDP_ABORTED;
	if (bpf_xdp_store_bytes(ctx, 0, c->data, len))
		return XDP_ABORTED;
	n = s->seq++;
	/* The first and the last frame of a call's count are timed here, so that
	 * the rate excludes BPF_PROG_RUN's setup and teardown (a page pool, and an
	 * RCU grace period: tens to hundreds of milliseconds per call). */
	if (n == c->seq_base)
		s->first_ns = bpf_ktime_get_ns();
	if (n + 1 == c->limit)
		s->last_ns = bpf_ktime_get_ns();
	if (c->mode == XG_ONE_FLOW)
		return XDP_TX;

	data = (void *)(long)ctx->data;
	data_end = (void *)(long)ctx->data_end;
	ip = data + XG_IP_OFF;
	if ((void *)(ip + 1) > data_end)
		return XDP_ABORTED;

	flow = c->mode == XG_SYN_ACK ? n >> 1 : n;
	saddr = ip->saddr;
	nsaddr = bpf_htonl(bpf_ntohl(saddr) + (__u32)(flow % c->addrs));
	ip->saddr = nsaddr;
	ipdiff = lbd_csum_diff4(saddr, nsaddr);
	ip->check = lbd_csum_apply(ip->check, ipdiff);

	if (ip->protocol == LBD_IPPROTO_TCP) {
		struct lbd_tcphdr *th = data + XG_L4_OFF;

		if ((void *)(th + 1) > data_end)
			return XDP_ABORTED;
		sport = th->source;
		nsport = bpf_htons(bpf_ntohs(sport) + (__u16)((flow / c->addrs) % c->ports));
		th->source = nsport;
		/* The pseudo-header holds the source address. */
		l4diff = ipdiff + lbd_csum_diff2(sport, nsport);
		if (c->mode == XG_SYN_ACK && (n & 1)) {
			/* The flow's second packet: what a client's handshake ACK would
			 * be, an ACK one past the SYN's sequence number. The flags byte
			 * shares its 16-bit word with the data offset. */
			__be16 *word = (__be16 *)&th->doff_res;
			__be16 oword = *word;
			__be32 oseq = th->seq;

			th->flags = LBD_TCP_ACK;
			th->seq = bpf_htonl(bpf_ntohl(oseq) + 1);
			l4diff += lbd_csum_diff2(oword, *word) + lbd_csum_diff4(oseq, th->seq);
		}
		th->check = lbd_csum_apply(th->check, l4diff);
	} else if (ip->protocol == LBD_IPPROTO_UDP) {
		struct lbd_udphdr *uh = data + XG_L4_OFF;

		if ((void *)(uh + 1) > data_end)
			return XDP_ABORTED;
		sport = uh->source;
		nsport = bpf_htons(bpf_ntohs(sport) + (__u16)((flow / c->addrs) % c->ports));
		uh->source = nsport;
		lbd_csum_apply_udp(&uh->check, ipdiff + lbd_csum_diff2(sport, nsport));
	} else {
		return XDP_ABORTED;
	}
	return XDP_TX;
}

/* The counter: IPv4 TCP and UDP frames are counted and, if xg_count_cfg says so,
 * dropped; everything else (ARP, ICMP, IPv6 neighbour discovery) passes, so that
 * the interface stays a working host interface. It also adds them to
 * xg_arrived, for an injector that paces itself on what arrived. */
struct xg_counts {
	__u64 packets;
	__u64 bytes;
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct xg_counts);
} xg_counters SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32); /* the verdict of a counted frame: XDP_DROP or XDP_PASS */
} xg_count_cfg SEC(".maps");

SEC("xdp")
int xg_count(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct lbd_ethhdr *eth = data;
	struct lbd_iphdr *ip = data + LBD_ETH_HLEN;
	struct xg_counts *cnt;
	__u32 zero = 0, *verdict;
	__u64 *arrived;

	if ((void *)(ip + 1) > data_end || eth->proto != bpf_htons(LBD_ETH_P_IP))
		return XDP_PASS;
	if (ip->protocol != LBD_IPPROTO_TCP && ip->protocol != LBD_IPPROTO_UDP)
		return XDP_PASS;
	cnt = bpf_map_lookup_elem(&xg_counters, &zero);
	verdict = bpf_map_lookup_elem(&xg_count_cfg, &zero);
	if (!cnt || !verdict)
		return XDP_PASS;
	cnt->packets++;
	cnt->bytes += data_end - data;
	arrived = bpf_map_lookup_elem(&xg_arrived, &zero);
	if (arrived)
		__sync_fetch_and_add(arrived, 1);
	return *verdict == XDP_DROP ? XDP_DROP : XDP_PASS;
}
