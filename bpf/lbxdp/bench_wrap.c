// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
//go:build ignore

/* Benchmark harness for lb_xdp (test builds only). BPF_PROG_TEST_RUN with Repeat
 * re-runs a program on the buffer the previous run left behind, so an
 * encapsulating path would be measured once and then on its own output. This
 * wrapper restores the input template before every run, optionally gives every
 * run a new flow, and tail-calls the program under test. */
#include "lbd_net.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

#define BW_MAX 256

struct bw_template {
	__u32 len;       /* bytes of data in use */
	__u32 vary;      /* nonzero: a new IPv4 source address and port every run */
	__u32 saddr_off; /* offset of the IPv4 source address */
	__u32 sport_off; /* offset of the transport source port */
	__u8 data[BW_MAX];
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct bw_template);
} bw_tmpl SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} bw_seq SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PROG_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
} bw_target SEC(".maps");

SEC("xdp")
int bench_wrap(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct bw_template *t;
	__u32 zero = 0, len;

	t = bpf_map_lookup_elem(&bw_tmpl, &zero);
	if (!t)
		return XDP_ABORTED;
	len = data_end - data;
	/* Keep clang from folding the subtraction below into 32-bit pointer
	 * arithmetic, which the verifier rejects. */
	asm volatile("" : "+r"(len));
	/* Undo a previous run's bpf_xdp_adjust_head (encapsulation). Called even
	 * when the length is right, so that the harness does the same work
	 * whatever the target did, and an empty target measures it exactly. */
	if (bpf_xdp_adjust_head(ctx, (int)len - (int)t->len))
		return XDP_ABORTED;
	len = t->len;
	if (len == 0 || len > BW_MAX)
		return XDP_ABORTED;
	if (bpf_xdp_store_bytes(ctx, 0, t->data, len))
		return XDP_ABORTED;
	if (t->vary) {
		__u64 *seq = bpf_map_lookup_elem(&bw_seq, &zero);
		__be32 saddr;
		__be16 sport;
		__u32 n;

		if (!seq)
			return XDP_ABORTED;
		n = (*seq)++;
		/* 2^17 sources in 198.18.0.0/15 times 2^15 ports: no flow repeats. */
		saddr = bpf_htonl(0xc6120000 | (n & 0x1ffff));
		sport = bpf_htons(0x8000 | ((n >> 17) & 0x7fff));
		if (bpf_xdp_store_bytes(ctx, t->saddr_off, &saddr, sizeof(saddr)) ||
		    bpf_xdp_store_bytes(ctx, t->sport_off, &sport, sizeof(sport)))
			return XDP_ABORTED;
	}
	bpf_tail_call(ctx, &bw_target, 0);
	return XDP_ABORTED;
}

/* The floors of a new flow: nothing but the insert of the packet's flow into a
 * conntrack-sized map. Run through bench_wrap like lb_xdp, so that the key comes
 * from a new frame every run and both see the same work around the insert. */

/* lb_ct_key's layout: 40 bytes, IPv4 or IPv6. */
struct bw_ct_key {
	__u8 saddr[16];
	__u8 daddr[16];
	__be16 sport;
	__be16 dport;
	__u8 proto;
	__u8 family;
	__u16 pad;
};

/* lb_ct4_key's layout: an IPv4 flow in 16 bytes. */
struct bw_ct4_key {
	__be32 saddr;
	__be32 daddr;
	__be16 sport;
	__be16 dport;
	__u8 proto;
	__u8 pad[3];
};

/* The 40-byte conntrack value lbd had before it was made compact. */
struct bw_ct_val40 {
	__u64 w[5];
};

/* lb_ct's 16 bytes. */
struct bw_ct_val {
	__u64 w[2];
};

/* Evict-on-insert designs: 1M-entry LRU hashes, full, so that every insert
 * evicts; one with lbd's former layout, one with its present one. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 1048576);
	__type(key, struct bw_ct_key);
	__type(value, struct bw_ct_val40);
} bw_ct_lru SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 1048576);
	__type(key, struct bw_ct4_key);
	__type(value, struct bw_ct_val);
} bw_ct_lru16 SEC(".maps");

/* lbd's design: a preallocated hash of lb_ct4's layout, sized by the test. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1310720);
	__type(key, struct bw_ct4_key);
	__type(value, struct bw_ct_val);
} bw_ct_hash SEC(".maps");

/* The packet's IPv4 flow (no IP options: the templates have none). */
LBD_INLINE int bw_flow4(struct xdp_md *ctx, struct bw_ct4_key *k)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;

	if (data + 14 + 20 + 4 > data_end)
		return -1;
	__builtin_memcpy(&k->saddr, data + 14 + 12, 4);
	__builtin_memcpy(&k->daddr, data + 14 + 16, 4);
	__builtin_memcpy(&k->sport, data + 14 + 20, 2);
	__builtin_memcpy(&k->dport, data + 14 + 22, 2);
	k->proto = *(__u8 *)(data + 14 + 9);
	return 0;
}

SEC("xdp")
int bench_ct_lru_insert(struct xdp_md *ctx)
{
	struct bw_ct4_key f = {};
	struct bw_ct_key k = {};
	struct bw_ct_val40 v = {};

	if (bw_flow4(ctx, &f))
		return XDP_ABORTED;
	__builtin_memcpy(k.saddr, &f.saddr, 4);
	__builtin_memcpy(k.daddr, &f.daddr, 4);
	k.sport = f.sport;
	k.dport = f.dport;
	k.proto = f.proto;
	k.family = 4;
	if (bpf_map_update_elem(&bw_ct_lru, &k, &v, BPF_ANY))
		return XDP_ABORTED;
	return XDP_PASS;
}

SEC("xdp")
int bench_ct_lru16_insert(struct xdp_md *ctx)
{
	struct bw_ct4_key k = {};
	struct bw_ct_val v = {};

	if (bw_flow4(ctx, &k) || bpf_map_update_elem(&bw_ct_lru16, &k, &v, BPF_ANY))
		return XDP_ABORTED;
	return XDP_PASS;
}

SEC("xdp")
int bench_ct_hash_insert(struct xdp_md *ctx)
{
	struct bw_ct4_key k = {};
	struct bw_ct_val v = {};

	if (bw_flow4(ctx, &k) || bpf_map_update_elem(&bw_ct_hash, &k, &v, BPF_NOEXIST))
		return XDP_ABORTED;
	return XDP_PASS;
}

/* The empty program: baseline of BPF_PROG_TEST_RUN itself when run directly,
 * of the harness plus BPF_PROG_TEST_RUN as a tail-call target. */
SEC("xdp")
int bench_pass(struct xdp_md *ctx)
{
	return XDP_PASS;
}

