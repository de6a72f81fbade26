#!/usr/bin/env bash
# The newcomer's demo: start lbd, program a service with lbctl, show what lbd holds.
#   examples/demo.sh up     start (idempotent: an earlier demo is stopped first)
#   examples/demo.sh down   stop it and remove everything it created
# Everything lives under $DEMO_DIR (default /tmp/lbd-demo); the daemon is stopped by the
# PID recorded there, never by name.
set -euo pipefail
cd "$(dirname "$0")/.."
DEMO_DIR=${DEMO_DIR:-/tmp/lbd-demo}
SOCK=$DEMO_DIR/lbd.sock
export LBCTL_SERVER=unix://$SOCK

down() {
	if [[ -f $DEMO_DIR/lbd.pid ]]; then
		pid=$(cat "$DEMO_DIR/lbd.pid")
		if kill -0 "$pid" 2>/dev/null; then
			kill -TERM "$pid"
			for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
		fi
	fi
	rm -rf "$DEMO_DIR"
	echo "demo removed"
}

up() {
	down >/dev/null
	mkdir -p "$DEMO_DIR"
	bin/lbd --state-dir "$DEMO_DIR/state" --socket "$SOCK" >"$DEMO_DIR/lbd.log" 2>&1 &
	echo $! >"$DEMO_DIR/lbd.pid"
	for _ in $(seq 50); do [[ -S $SOCK ]] && break; sleep 0.1; done
	[[ -S $SOCK ]] || { cat "$DEMO_DIR/lbd.log"; echo "lbd did not start"; exit 1; }
	set -x
	bin/lbctl service create web --vip 203.0.113.10 --port 80 --protocol tcp \
		--backend 198.18.1.10:8080 --backend 198.18.1.11:8080,weight=2 --backend 198.18.1.12:8080
	bin/lbctl backend drain web 198.18.1.12:8080
	bin/lbctl service list
	bin/lbctl service get web
	bin/lbctl node get
	{ set +x; } 2>/dev/null
	cat <<MSG

lbd is running (PID $(cat "$DEMO_DIR/lbd.pid"), log $DEMO_DIR/lbd.log). Poke at it:
  export LBCTL_SERVER=$LBCTL_SERVER
  bin/lbctl service get web -o yaml
  bin/lbctl backend add web 198.18.1.13:8080
Stop it with: make demo-down
MSG
}

case ${1:-} in
up) up ;;
down) down ;;
*) echo "usage: $0 up|down" >&2; exit 2 ;;
esac
