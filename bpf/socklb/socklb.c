// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
//go:build ignore

/* Socket-level load balancing for processes of one cgroup (v2): connect() and
 * unconnected UDP sends to a service (VIP, port or wildcard, protocol) are
 * translated to a backend before the first packet exists, so a node reaches its
 * VIPs without a round trip through an LB node. recvmsg() and getpeername()
 * translate the backend back, so applications only ever see the VIP.
 *
 * The service state is the XDP datapath's (lbstate.h): the Go loader passes its
 * maps in, so drain, disable, health and weights are whatever the Maglev tables
 * say. A backend is chosen per connect() (TCP, connected UDP) and kept per
 * socket and service for unconnected UDP. Session affinity identifies a local
 * client by its network namespace. A service without a usable backend makes
 * connect() and sends fail at once with ECONNREFUSED. Source ranges are not
 * checked: a local process has no client address of its own yet. */
#include "lbd_net.h"
#include "lbxdp.h"
#include "lbstate.h"
#include "socklb.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

#define SK_ECONNREFUSED 111
#define SK_SOCK_STREAM 1
#define SK_SOCK_DGRAM 2

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, SK_DEFAULT_REVNAT_SIZE);
	__type(key, struct sk_rev_key);
	__type(value, struct sk_rev);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sk_revnat SEC(".maps");

/* The sk_revnat key of a connected socket, kept with the socket itself. When a
 * blocking connect() fails (refused, timed out), the kernel clears the socket's peer
 * (tcp_disconnect) before sock_release runs, so the peer address could no longer name
 * the entry to delete; and a UDP socket that connects again leaves its previous
 * entry behind. The kernel frees a socket's storage with the socket; the map is
 * pinned so that a restarted daemon's programs still find the keys of sockets
 * translated before the restart. */
struct {
	__uint(type, BPF_MAP_TYPE_SK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct sk_rev_key);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sk_peer SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, SK_DEFAULT_UDP_SIZE);
	__type(key, struct sk_udp_key);
	__type(value, struct sk_udp);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sk_udp_backend SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, SK_DEFAULT_AFF_SIZE);
	__type(key, struct sk_aff_key);
	__type(value, struct sk_aff);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sk_affinity SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, SK_STAT_MAX);
	__type(key, __u32);
	__type(value, __u64);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sk_stats SEC(".maps");

/* A socket address in map form. */
struct sk_addr {
	__u8 addr[16];
	__be16 port;
	__u8 family; /* LBD_FAMILY_V4 (also for v4-mapped IPv6) or LBD_FAMILY_V6 */
	__u8 proto;
};

LBD_INLINE void sk_count(__u32 stat)
{
	__u64 *c = bpf_map_lookup_elem(&sk_stats, &stat);

	if (c)
		(*c)++;
}

/* The protocol of a socket lbd may translate: TCP stream or UDP datagram. */
LBD_INLINE __u8 sk_proto(__u32 type, __u32 protocol)
{
	if (type == SK_SOCK_STREAM && protocol == LBD_IPPROTO_TCP)
		return LBD_IPPROTO_TCP;
	if (type == SK_SOCK_DGRAM && protocol == LBD_IPPROTO_UDP)
		return LBD_IPPROTO_UDP;
	return 0;
}

LBD_INLINE void sk_read4(struct bpf_sock_addr *ctx, struct sk_addr *a)
{
	__u32 ip = ctx->user_ip4;

	__builtin_memcpy(a->addr, &ip, 4);
	a->port = (__be16)ctx->user_port;
	a->family = LBD_FAMILY_V4;
}

LBD_INLINE void sk_write4(struct bpf_sock_addr *ctx, const struct sk_addr *a)
{
	__u32 ip;

	__builtin_memcpy(&ip, a->addr, 4);
	ctx->user_ip4 = ip;
	ctx->user_port = (__u32)a->port;
}

/* An IPv6 socket address; a v4-mapped one (::ffff:a.b.c.d, dual-stack sockets)
 * becomes the IPv4 address, so that it finds IPv4 services. */
LBD_INLINE void sk_read6(struct bpf_sock_addr *ctx, struct sk_addr *a)
{
	__u32 w[4];

	w[0] = ctx->user_ip6[0];
	w[1] = ctx->user_ip6[1];
	w[2] = ctx->user_ip6[2];
	w[3] = ctx->user_ip6[3];
	a->port = (__be16)ctx->user_port;
	if (w[0] == 0 && w[1] == 0 && w[2] == bpf_htonl(0xffff)) {
		__builtin_memcpy(a->addr, &w[3], 4);
		a->family = LBD_FAMILY_V4;
		return;
	}
	__builtin_memcpy(a->addr, w, 16);
	a->family = LBD_FAMILY_V6;
}

LBD_INLINE void sk_write6(struct bpf_sock_addr *ctx, const struct sk_addr *a)
{
	__u32 w[4];

	if (a->family == LBD_FAMILY_V4) {
		w[0] = 0;
		w[1] = 0;
		w[2] = bpf_htonl(0xffff);
		__builtin_memcpy(&w[3], a->addr, 4);
	} else {
		__builtin_memcpy(w, a->addr, 16);
	}
	ctx->user_ip6[0] = w[0];
	ctx->user_ip6[1] = w[1];
	ctx->user_ip6[2] = w[2];
	ctx->user_ip6[3] = w[3];
	ctx->user_port = (__u32)a->port;
}

/* The backend a new connection (or a socket's first datagram) to svc goes to:
 * the namespace's affinity entry while it is fresh, else the Maglev table. */
LBD_INLINE __u32 sk_choose(struct bpf_sock_addr *ctx, const struct lb_service *svc, __u64 now)
{
	struct sk_aff_key ak = { .service_id = svc->id };
	struct sk_aff *aff;
	__u32 id, hash;
	__u64 netns;

	if (svc->flags & LB_SVC_AFFINITY) {
		ak.netns_cookie = bpf_get_netns_cookie(ctx);
		aff = bpf_map_lookup_elem(&sk_affinity, &ak);
		/* A timestamp ahead of this CPU's clock counts as fresh. */
		if (aff && (now < aff->last_seen_ns ||
			    now - aff->last_seen_ns <= (__u64)svc->affinity_timeout * LBD_NSEC_PER_SEC) &&
		    lb_backend_get(aff->backend_id)) {
			aff->last_seen_ns = now;
			return aff->backend_id;
		}
	}
	/* Hashing by source: the namespace is the local client. Otherwise each
	 * connection draws its own slot, so weights apply per connection. */
	if (svc->flags & LB_SVC_HASH_SRC) {
		netns = bpf_get_netns_cookie(ctx);
		hash = (__u32)(netns ^ (netns >> 32));
	} else {
		hash = bpf_get_prandom_u32();
	}
	id = lb_maglev_pick(svc, hash);
	if (id && (svc->flags & LB_SVC_AFFINITY)) {
		struct sk_aff na = { .last_seen_ns = now, .backend_id = id };

		bpf_map_update_elem(&sk_affinity, &ak, &na, BPF_ANY);
	}
	return id;
}

#define SK_PASS 0      /* not a service: leave the address alone */
#define SK_XLATED 1    /* a rewritten to the backend */
#define SK_REFUSED 2   /* a service without a usable backend */

/* Translates a (a service address) to a backend and records the reverse entry.
 * udp_sticky: an unconnected UDP send, which keeps the socket's backend. */
LBD_INLINE int sk_translate(struct bpf_sock_addr *ctx, struct sk_addr *a, int udp_sticky)
{
	struct lb_vip_key vk = { .family = a->family };
	struct lb_service_key sk = { .port = a->port, .proto = a->proto, .family = a->family };
	struct sk_udp_key uk = {};
	struct lb_service *svc;
	struct lb_backend *be = NULL;
	struct lb_vip *vip;
	__u64 cookie, now;
	__u32 be_id = 0;
	struct sk_rev rev = {};
	struct sk_rev_key rk = {};

	__builtin_memcpy(vk.addr, a->addr, 16);
	vip = bpf_map_lookup_elem(&lb_vips, &vk);
	if (!vip)
		return SK_PASS;
	__builtin_memcpy(sk.addr, a->addr, 16);
	svc = lb_service_get(&sk, vip);
	if (!svc)
		return SK_PASS;

	cookie = bpf_get_socket_cookie(ctx);
	now = bpf_ktime_get_ns();
	if (udp_sticky) {
		struct sk_udp *u;

		uk.cookie = cookie;
		__builtin_memcpy(uk.vip, a->addr, 16);
		uk.vport = a->port;
		uk.family = a->family;
		u = bpf_map_lookup_elem(&sk_udp_backend, &uk);
		if (u && u->service_id == svc->id) {
			be = lb_backend_get(u->backend_id);
			if (be)
				be_id = u->backend_id;
		}
	}
	if (!be) {
		be_id = sk_choose(ctx, svc, now);
		be = lb_backend_get(be_id);
	}
	if (!be || be->family != a->family) {
		sk_count(SK_STAT_NO_BACKEND);
		bpf_set_retval(-SK_ECONNREFUSED);
		return SK_REFUSED;
	}
	if (udp_sticky) {
		struct sk_udp nu = { .backend_id = be_id, .service_id = svc->id };

		bpf_map_update_elem(&sk_udp_backend, &uk, &nu, BPF_ANY);
	}

	__builtin_memcpy(rev.vip, a->addr, 16);
	rev.vport = a->port;
	rev.family = a->family;
	rev.service_id = svc->id;
	rev.backend_id = be_id;
	rev.created_ns = now;

	__builtin_memcpy(a->addr, be->addr, 16);
	if (be->port)
		a->port = be->port;
	rk.cookie = cookie;
	__builtin_memcpy(rk.addr, a->addr, 16);
	rk.port = a->port;
	rk.family = a->family;
	rk.proto = a->proto;
	if (!udp_sticky) {
		struct sk_rev_key *peer = bpf_sk_storage_get(&sk_peer, ctx->sk, 0, BPF_SK_STORAGE_GET_F_CREATE);

		if (peer) {
			if (peer->cookie)
				bpf_map_delete_elem(&sk_revnat, peer);
			*peer = rk;
		}
	}
	if (bpf_map_update_elem(&sk_revnat, &rk, &rev, BPF_ANY))
		sk_count(SK_STAT_REVNAT_FULL);
	sk_count(udp_sticky ? SK_STAT_SENDMSG : SK_STAT_CONNECT);
	return SK_XLATED;
}

/* Translates a backend peer address back to the service the socket addressed. */
LBD_INLINE int sk_reverse(struct bpf_sock_addr *ctx, struct sk_addr *a)
{
	struct sk_rev_key rk = { .port = a->port, .family = a->family, .proto = a->proto };
	struct sk_rev *rev;

	rk.cookie = bpf_get_socket_cookie(ctx);
	__builtin_memcpy(rk.addr, a->addr, 16);
	rev = bpf_map_lookup_elem(&sk_revnat, &rk);
	if (!rev)
		return 0;
	__builtin_memcpy(a->addr, rev->vip, 16);
	a->port = rev->vport;
	sk_count(SK_STAT_REVERSE);
	return 1;
}

/* Forward hooks (connect, sendmsg): 1 lets the call go on, rewritten or not; 0
 * fails it with the value set by bpf_set_retval (ECONNREFUSED). v6: the hook of
 * IPv6 sockets, whose addresses are read and written as IPv6 (v4-mapped or not). */
LBD_INLINE int sk_forward(struct bpf_sock_addr *ctx, int v6, int udp_sticky)
{
	struct sk_addr a = {};
	int r;

	a.proto = sk_proto(ctx->type, ctx->protocol);
	if (!a.proto)
		return 1;
	if (v6)
		sk_read6(ctx, &a);
	else
		sk_read4(ctx, &a);
	r = sk_translate(ctx, &a, udp_sticky);
	if (r == SK_REFUSED)
		return 0;
	if (r == SK_XLATED) {
		if (v6)
			sk_write6(ctx, &a);
		else
			sk_write4(ctx, &a);
	}
	return 1;
}

/* Backward hooks (recvmsg, getpeername): the backend becomes the service again. */
LBD_INLINE int sk_backward(struct bpf_sock_addr *ctx, int v6)
{
	struct sk_addr a = {};

	a.proto = sk_proto(ctx->type, ctx->protocol);
	if (!a.proto)
		return 1;
	if (v6)
		sk_read6(ctx, &a);
	else
		sk_read4(ctx, &a);
	if (sk_reverse(ctx, &a)) {
		if (v6)
			sk_write6(ctx, &a);
		else
			sk_write4(ctx, &a);
	}
	return 1;
}

SEC("cgroup/connect4")
int sk_connect4(struct bpf_sock_addr *ctx)
{
	return sk_forward(ctx, 0, 0);
}

SEC("cgroup/connect6")
int sk_connect6(struct bpf_sock_addr *ctx)
{
	return sk_forward(ctx, 1, 0);
}

SEC("cgroup/sendmsg4")
int sk_sendmsg4(struct bpf_sock_addr *ctx)
{
	return sk_forward(ctx, 0, 1);
}

SEC("cgroup/sendmsg6")
int sk_sendmsg6(struct bpf_sock_addr *ctx)
{
	return sk_forward(ctx, 1, 1);
}

SEC("cgroup/recvmsg4")
int sk_recvmsg4(struct bpf_sock_addr *ctx)
{
	return sk_backward(ctx, 0);
}

SEC("cgroup/recvmsg6")
int sk_recvmsg6(struct bpf_sock_addr *ctx)
{
	return sk_backward(ctx, 1);
}

SEC("cgroup/getpeername4")
int sk_getpeername4(struct bpf_sock_addr *ctx)
{
	return sk_backward(ctx, 0);
}

SEC("cgroup/getpeername6")
int sk_getpeername6(struct bpf_sock_addr *ctx)
{
	return sk_backward(ctx, 1);
}

/* A closing socket takes its connected peer's reverse entry with it (the key kept in
 * sk_peer); entries of unconnected UDP sockets (one per backend they sent to) age out
 * of the LRU. */
SEC("cgroup/sock_release")
int sk_release(struct bpf_sock *ctx)
{
	struct sk_rev_key *peer;

	if (!sk_proto(ctx->type, ctx->protocol))
		return 1;
	peer = bpf_sk_storage_get(&sk_peer, ctx, 0, 0);
	if (peer && peer->cookie)
		bpf_map_delete_elem(&sk_revnat, peer);
	return 1;
}
