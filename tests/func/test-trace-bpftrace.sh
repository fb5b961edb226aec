#!/bin/bash
# USDT probes with a real tracer: bpftrace attached to a serving ioplane counts
# nbd_request hits for export e0 (a throttled null node) while qemu-io sends exactly N
# reads to it (at least N read requests must be seen), and every bpftrace one-liner of docs/tracing.md,
# pointed at this executable, attaches, runs through an NBD and qcow2 workload and
# prints its map. Skips (77) where bpftrace cannot attach uprobes here.
. "$(dirname "$0")/nbd-lib.sh"

nbd_need_ioplane
need bpftrace qemu-io qemu-img python3
[ "$(id -u)" = 0 ] || skip "bpftrace needs root"
N=20
sock=$NBD_TMP/nbd.sock
img=$NBD_TMP/c.qcow2
# A backing file with data: a small write into a new cluster copies the rest of it.
qemu-img create -q -f raw "$NBD_TMP/base.raw" 16M
qemu-io -f raw -c 'write -P 3 0 16M' "$NBD_TMP/base.raw" >/dev/null
qemu-img create -q -f qcow2 -o cluster_size=64k -b "$NBD_TMP/base.raw" -F raw "$img" 16M
bt_pid=

bt_stop() {
	[ -n "$bt_pid" ] || return 0
	kill -INT "$bt_pid" 2>/dev/null || true
	for _ in $(seq 100); do kill -0 "$bt_pid" 2>/dev/null || break; sleep 0.1; done
	kill -KILL "$bt_pid" 2>/dev/null || true
	wait "$bt_pid" 2>/dev/null || true
	bt_pid=
}
at_exit bt_stop

# bt_start PROGRAM OUT: bpftrace running PROGRAM, once its probes are attached.
bt_start() {
	ulimit -l unlimited 2>/dev/null || true
	bpftrace -e "$1 BEGIN { printf(\"ready\\n\"); }" >"$2" 2>&1 &
	bt_pid=$!
	for _ in $(seq 300); do
		grep -q '^ready' "$2" && return 0
		kill -0 "$bt_pid" 2>/dev/null || break
		sleep 0.1
	done
	bt_stop
	return 1
}

nbd_serve --image c,file="$img",format=qcow2 \
	--object throttle-group,id=tg,limits.iops-total=100 \
	--blockdev driver=null-co,node-name=n0,size=1048576 \
	--blockdev driver=throttle,node-name=t0,throttle-group=tg,file=n0 \
	--nbd-server addr.type=unix,addr.path="$sock" \
	--export type=nbd,id=e0,node-name=t0,name=e0 \
	--export type=nbd,id=c,node-name=c,name=c,writable=on
probe="usdt:$IOPLANE:ioplane"
# Reads at offsets below N*4k are counted; one at 512k is the warm-up that shows the
# probe attached (bpftrace may print BEGIN before every uprobe is live).
# One clause: two programs on one probe point do not both fire everywhere.
if ! bt_start "$probe:nbd_request /str(arg0) == \"e0\"/ { if (arg3 == 524288) { \
	printf(\"warm\\n\"); } else if (arg2 == 0 && arg3 < $((N * 4096))) { @reads = count(); } }" \
	"$NBD_TMP/count.out"; then
	skip "bpftrace cannot attach to USDT probes here: $(grep -m1 -i 'error' \
		"$NBD_TMP/count.out" || tail -1 "$NBD_TMP/count.out")"
fi
for _ in $(seq 30); do
	qemu-io -r -f raw -c 'read 512k 4k' "$(nbd_uri e0 "$sock")" >/dev/null || fail "warm-up read"
	grep -q '^warm' "$NBD_TMP/count.out" && break
	sleep 0.5
done
grep -q '^warm' "$NBD_TMP/count.out" || fail "no probe hit for 30 warm-up reads: $(cat "$NBD_TMP/count.out")"
cmds=()
for i in $(seq 0 $((N - 1))); do cmds+=(-c "read $((i * 4096)) 4k"); done
qemu-io -r -f raw "${cmds[@]}" "$(nbd_uri e0 "$sock")" >/dev/null || fail "qemu-io reads"
bt_stop
hits=$(sed -n 's/^@reads: \([0-9]*\)$/\1/p' "$NBD_TMP/count.out")
[ -n "$hits" ] && [ "$hits" -ge "$N" ] ||
	fail "nbd_request counted ${hits:-no} reads of e0 for $N sent: $(cat "$NBD_TMP/count.out")"
echo "ok: nbd_request fired $hits times for $N reads"

# The documented one-liners, each through a workload that reaches its probes.
python3 - "$IOPLANE_SRC/docs/tracing.md" "$IOPLANE" "$NBD_TMP/oneliner" <<'PY' ||
import re, sys
doc, exe, out = sys.argv[1:]
blocks = re.findall(r"```sh\n(bpftrace -e '.*?')\n```", open(doc).read(), re.S)
for i, b in enumerate(blocks):
    prog = b[len("bpftrace -e '"):-1].replace('/usr/bin/ioplane', exe)
    open('%s.%d' % (out, i), 'w').write(prog)

PY
	fail "cannot read the one-liners of docs/tracing.md"
n=$(ls "$NBD_TMP"/oneliner.* | wc -l)
[ "$n" -ge 4 ] || fail "only $n bpftrace one-liners in docs/tracing.md"
# oneliner_run FILE K: the one-liner in FILE through one workload (fresh clusters at K MiB).
oneliner_run() {
	bt_start "$(cat "$1")" "$1.out" || fail "one-liner $(cat "$1") does not attach: $(cat "$1.out")"
	qemu-io -f raw -c "write -P 7 ${2}M 4k" -c "write -P 8 ${2}200k 8k" -c "read -P 7 ${2}M 4k" \
		"$(nbd_uri c "$sock")" >/dev/null || fail "qemu-io on the qcow2 export"
	qemu-io -r -f raw "${cmds[@]}" "$(nbd_uri e0 "$sock")" >/dev/null || fail "qemu-io e0"
	bt_stop
	! grep -qi 'syntax error\|unknown identifier\|^stdin:.*ERROR' "$1.out" ||
		fail "one-liner: $(cat "$1.out")"
	grep -q '^@' "$1.out"
}
k=0
for f in "$NBD_TMP"/oneliner.*; do
	# Up to three workloads: a uprobe may go live only after bpftrace's BEGIN.
	for _ in 1 2 3; do
		k=$((k + 1))
		oneliner_run "$f" $k && continue 2
	done
	fail "one-liner printed no map: $(cat "$f") -> $(cat "$f.out")"
done
echo "ok: $n one-liners of docs/tracing.md attach and print their maps"
