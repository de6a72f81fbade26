#!/usr/bin/env bash
# lbd end to end on one machine, in network namespaces (root):
#
#   client ─ router (BIRD: ECMP over the LB nodes) ─ fabric bridge ─ lb1, lb2   (lbd --role lb, XDP)
#                                                                 └─ be1..be3  (lbd --role backend, TC,
#                                                                               an HTTP server each)
#
# The LB nodes send client packets to the backend nodes in Geneve; the backends answer the
# client directly through the router (DSR).
#
#   examples/demo-netns.sh up     build the topology, start everything, create a service with
#                                 lbctl, send traffic and show what happened
#   examples/demo-netns.sh down   stop it and remove everything it created
#
# Needs bin/lbd and bin/lbctl (make build; BIN_DIR overrides bin/) and ip, nsenter,
# ethtool, bird, birdc, clang, curl, python3. Processes are stopped by the PIDs recorded
# under $DEMO_DIR, never by name.
set -euo pipefail
cd "$(dirname "$0")/.."

DEMO_DIR=${DEMO_DIR:-/tmp/lbd-demo-netns}
P=lbdemo # namespace and interface prefix
VIP=203.0.113.10
NODES=(lb1 lb2 be1 be2 be3)
NAMESPACES=("$P-client" "$P-router" "$P-fabric")
for n in "${NODES[@]}"; do NAMESPACES+=("$P-$n"); done
BIN_DIR=${BIN_DIR:-$PWD/bin}
LBD=$BIN_DIR/lbd
LBCTL=$BIN_DIR/lbctl

addr4() { case $1 in lb*) echo "198.18.0.1${1#lb}" ;; be*) echo "198.18.0.2${1#be}" ;; esac; }
addr6() { case $1 in lb*) echo "2001:db8:f::1${1#lb}" ;; be*) echo "2001:db8:f::2${1#be}" ;; esac; }
mac() { case $1 in lb*) echo "02:00:00:00:01:0${1#lb}" ;; be*) echo "02:00:00:00:02:0${1#be}" ;; esac; }
lbctl() { local node=$1; shift; "$LBCTL" -s "unix://$DEMO_DIR/$node/lbd.sock" "$@"; }

# stop_pid stops the process whose PID a file records, if it is still ours (its command
# line names $DEMO_DIR), with SIGTERM and then SIGKILL.
stop_pid() {
	local file=$1 pid
	[[ -f $file ]] || return 0
	pid=$(cat "$file")
	if [[ -r /proc/$pid/cmdline ]] && tr '\0' ' ' <"/proc/$pid/cmdline" | grep -qF "$DEMO_DIR"; then
		kill -TERM "$pid" 2>/dev/null || true
		for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
		kill -KILL "$pid" 2>/dev/null || true
	fi
	rm -f "$file"
}

down() {
	if [[ -d $DEMO_DIR ]]; then
		for f in "$DEMO_DIR"/pids/*.pid "$DEMO_DIR/bird.pid"; do stop_pid "$f"; done
		if mountpoint -q "$DEMO_DIR/bpffs"; then
			for n in "${NODES[@]}"; do rm -rf "${DEMO_DIR:?}/bpffs/$n"; done
			umount "$DEMO_DIR/bpffs"
		fi
	fi
	for ns in "${NAMESPACES[@]}"; do
		ip netns delete "$ns" 2>/dev/null || true
	done
	rm -rf "$DEMO_DIR"
	echo "demo removed"
}

# spawn NAME NS CMD... starts a process in a namespace (nsenter only switches the network
# namespace, so lbd keeps seeing the bpffs), logging to $DEMO_DIR/NAME.log.
spawn() {
	local name=$1 ns=$2
	shift 2
	nsenter --net="/run/netns/$ns" -- "$@" >"$DEMO_DIR/$name.log" 2>&1 &
	echo $! >"$DEMO_DIR/pids/$name.pid"
}

check_tools() {
	[[ $(id -u) == 0 ]] || { echo "demo-netns: run as root (it creates namespaces and loads BPF programs)" >&2; exit 1; }
	local missing=()
	for tool in ip nsenter ethtool bird birdc clang curl python3 mountpoint; do
		command -v "$tool" >/dev/null || missing+=("$tool")
	done
	((${#missing[@]} == 0)) || { echo "demo-netns: missing ${missing[*]} (make deps)" >&2; exit 1; }
	[[ -x $LBD && -x $LBCTL ]] || { echo "demo-netns: $LBD or $LBCTL missing: run make build" >&2; exit 1; }
}

network() {
	for ns in "${NAMESPACES[@]}"; do ip netns add "$ns"; done
	ip link add "$P-cl" netns "$P-client" type veth peer name "$P-rc" netns "$P-router"
	ip link add "$P-rf" mtu 1600 netns "$P-router" type veth peer name "$P-brf" mtu 1600 netns "$P-fabric"
	for n in "${NODES[@]}"; do
		ip link add "$P-$n" mtu 1600 address "$(mac "$n")" netns "$P-$n" type veth \
			peer name "$P-b$n" mtu 1600 netns "$P-fabric"
	done
	ip -n "$P-fabric" link add "$P-br" type bridge mcast_snooping 0
	ip -n "$P-fabric" link set "$P-br" up
	for port in "$P-brf" "${NODES[@]/#/$P-b}"; do
		ip -n "$P-fabric" link set "$port" master "$P-br" up
	done

	ip -n "$P-client" link set lo up
	ip -n "$P-client" addr add 198.19.1.2/24 dev "$P-cl"
	ip -n "$P-client" addr add 2001:db8:1::2/64 dev "$P-cl" nodad
	ip -n "$P-client" link set "$P-cl" up
	ip -n "$P-client" route add default via 198.19.1.1
	ip -n "$P-client" route add ::/0 via 2001:db8:1::1
	ip netns exec "$P-client" ethtool -K "$P-cl" tx off >/dev/null

	ip -n "$P-router" link set lo up
	ip -n "$P-router" addr add 198.19.1.1/24 dev "$P-rc"
	ip -n "$P-router" addr add 2001:db8:1::1/64 dev "$P-rc" nodad
	ip -n "$P-router" addr add 198.18.0.1/24 dev "$P-rf"
	ip -n "$P-router" addr add 2001:db8:f::1/64 dev "$P-rf" nodad
	ip -n "$P-router" link set "$P-rc" up
	ip -n "$P-router" link set "$P-rf" up
	# Hash on addresses, protocol and ports: a flow keeps its LB node.
	ip netns exec "$P-router" sysctl -qw net.ipv4.ip_forward=1 net.ipv6.conf.all.forwarding=1 \
		net.ipv4.fib_multipath_hash_policy=3 net.ipv4.fib_multipath_hash_fields=0x0037

	for n in "${NODES[@]}"; do
		ip -n "$P-$n" link set lo up
		ip -n "$P-$n" addr add "$(addr4 "$n")/24" dev "$P-$n"
		ip -n "$P-$n" addr add "$(addr6 "$n")/64" dev "$P-$n" nodad
		ip -n "$P-$n" link set "$P-$n" up
	done
	for lb in lb1 lb2; do
		# bpf_fib_lookup needs forwarding and neighbour entries for the backend nodes.
		ip netns exec "$P-$lb" sysctl -qw net.ipv4.ip_forward=1 net.ipv6.conf.all.forwarding=1
		for be in be1 be2 be3; do
			ip -n "$P-$lb" neigh replace "$(addr4 "$be")" lladdr "$(mac "$be")" dev "$P-$lb" nud permanent
		done
	done
	for be in be1 be2 be3; do
		ip -n "$P-$be" route add default via 198.18.0.1 advmss 1460
		ip netns exec "$P-$be" ethtool -K "$P-$be" tx off >/dev/null
	done

	# XDP_TX out of a veth needs an XDP program on its peer: a one-line XDP_PASS.
	echo 'int xdp_pass(void *ctx) __attribute__((section("xdp"))); int xdp_pass(void *ctx) { return 2; }
char _license[] __attribute__((section("license"))) = "GPL";' >"$DEMO_DIR/xdp_pass.c"
	clang -O2 -target bpf -c "$DEMO_DIR/xdp_pass.c" -o "$DEMO_DIR/xdp_pass.o"
	for lb in lb1 lb2; do
		ip -n "$P-fabric" link set dev "$P-b$lb" xdpdrv obj "$DEMO_DIR/xdp_pass.o" sec xdp
	done
}

router() {
	cat >"$DEMO_DIR/bird.conf" <<EOF
router id 198.18.0.1;
protocol device {}
protocol kernel { ipv4 { export all; }; merge paths on; }
protocol static vips { ipv4; route $VIP/32 via $(addr4 lb1) via $(addr4 lb2); }
EOF
	ip netns exec "$P-router" bird -c "$DEMO_DIR/bird.conf" -s "$DEMO_DIR/bird.ctl" -P "$DEMO_DIR/bird.pid"
	for _ in $(seq 100); do
		[[ $(ip -n "$P-router" route show "$VIP" | grep -c nexthop) == 2 ]] && return
		sleep 0.1
	done
	echo "demo-netns: the router installed no ECMP route to $VIP" >&2
	exit 1
}

daemons() {
	# A bpffs of its own: pins live there whether or not /sys/fs/bpf is mounted.
	mkdir -p "$DEMO_DIR/bpffs"
	mount -t bpf bpf "$DEMO_DIR/bpffs"
	for n in "${NODES[@]}"; do
		mkdir -p "$DEMO_DIR/$n"
		local args=(--interface "$P-$n" --state-dir "$DEMO_DIR/$n/state" --socket "$DEMO_DIR/$n/lbd.sock"
			--bpffs-dir "$DEMO_DIR/bpffs/$n" --metrics-listen 127.0.0.1:9100)
		case $n in
		lb*) spawn "lbd-$n" "$P-$n" "$LBD" --role lb --hash-seed 1 "${args[@]}" ;;
		be*)
			spawn "lbd-$n" "$P-$n" "$LBD" --role backend --lb-source 198.18.0.0/24 "${args[@]}"
			mkdir -p "$DEMO_DIR/www-$n"
			echo "$n" >"$DEMO_DIR/www-$n/index.html"
			spawn "http-$n" "$P-$n" python3 -m http.server 8080 --bind "$(addr4 "$n")" --directory "$DEMO_DIR/www-$n"
			;;
		esac
	done
	# lbd answers as soon as its state is restored; changes that add Maglev tables wait
	# until its datapath is open (attached): wait for that.
	for n in "${NODES[@]}"; do
		for _ in $(seq 100); do
			lbctl "$n" node get -o json 2>/dev/null | grep -q '"datapathAttached": *true' && continue 2
			sleep 0.1
		done
		cat "$DEMO_DIR/lbd-$n.log"
		echo "demo-netns: lbd on $n did not start" >&2
		exit 1
	done
}

up() {
	check_tools
	down >/dev/null
	mkdir -p "$DEMO_DIR/pids"
	echo "== network: client, router (BIRD), fabric bridge, LB nodes lb1 lb2, backend nodes be1 be2 be3"
	network
	router
	daemons
	echo "== the same service on both LB nodes"
	local create=(service create web --vip "$VIP" --port 80 --protocol tcp
		--backend "$(addr4 be1):8080" --backend "$(addr4 be2):8080" --backend "$(addr4 be3):8080")
	for lb in lb1 lb2; do
		echo "   bin/lbctl -s unix://$DEMO_DIR/$lb/lbd.sock ${create[*]}"
		lbctl "$lb" "${create[@]}" >/dev/null
	done
	for _ in $(seq 100); do
		ip netns exec "$P-client" curl -s --max-time 1 --local-port 19999 "http://$VIP/" >/dev/null && break
		sleep 0.1
	done

	echo "== 90 HTTP requests from the client to http://$VIP/, each from its own port"
	for port in $(seq 20001 20090); do
		ip netns exec "$P-client" curl -s --max-time 2 --local-port "$port" "http://$VIP/" || echo failed
	done | sort | uniq -c | sed 's/^/   requests answered by /'
	for lb in lb1 lb2; do
		echo "== lbctl stats on $lb"
		lbctl "$lb" stats
	done
	echo "== lbctl trace on both LB nodes: the same backend for the same flow"
	for lb in lb1 lb2; do lbctl "$lb" trace tcp 198.19.1.2 20001 "$VIP" 80; done

	cat <<MSG

The demo is running (logs in $DEMO_DIR). Poke at it:
  export LBCTL_SERVER=unix://$DEMO_DIR/lb1/lbd.sock
  bin/lbctl service get web
  bin/lbctl conntrack list
  bin/lbctl backend drain web $(addr4 be1):8080      # on lb2 too: -s unix://$DEMO_DIR/lb2/lbd.sock
  ip netns exec $P-client curl http://$VIP/
Stop it with: $0 down
MSG
}

case ${1:-} in
up) up ;;
down) down ;;
*) echo "usage: $0 up|down" >&2; exit 2 ;;
esac
