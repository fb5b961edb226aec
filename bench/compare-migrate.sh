#!/bin/bash
# Live migration of a guest whose disk is a vhost-user-blk export: ioplane vs
# qemu-storage-daemon side by side in one invocation. Each run boots the real Linux guest
# of tests/vm/run-vm-test.sh (QEMU TCG) on one export; a second export of the same disk
# (same daemon) serves the destination QEMU; once the guest writes and verifies from every
# vCPU (and fio at depth 32 when fio is installed), QEMU migrates it over a unix socket and
# the guest verifies on the destination. Per server: QEMU's own figures from
# query-migrate (total time and downtime, in ms), and the CPU time the server (all its
# threads) and the source QEMU used from the migrate command to completion (on a 2-CPU
# machine the server's CPU is taken from the guest's vCPUs and QEMU's migration thread),
# medians of --reps runs, runs alternating between servers; then the ratios ioplane/qsd
# (target: both <= 1.0). A run that fails (the guest does not finish on the destination
# within --timeout) is counted, its server log shown and its run directory kept (the
# path is printed), and the other runs go on: qemu-storage-daemon 7.2's libvhost-user
# was seen to panic on the destination ("vu_panic: Error writing eventfd: Bad file
# descriptor"), leaving the guest's disk dead.
#
#   bench/compare-migrate.sh [--reps N] [--mem MB] [--no-fio] [--timeout S]
#
# A benchmark, not a test: exit 0 whether the target is met or not; 2 on bad usage, 1 when
# no run of a server succeeded.
set -euo pipefail

src=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
IOPLANE=${IOPLANE:-$src/build/ioplane}
reps=3
mem=1024
fio=--fio
timeout=300
while [ $# -gt 0 ]; do
	case "$1" in
	--reps) reps=${2:?}; shift ;;
	--mem) mem=${2:?}; shift ;;
	--no-fio) fio= ;;
	--timeout) timeout=${2:?}; shift ;;
	-h | --help) sed -n '2,/^set /{/^#/s/^# \{0,1\}//p}' "$0" >&2; exit 2 ;;
	*) echo "compare-migrate: unknown option $1" >&2; exit 2 ;;
	esac
	shift
done
command -v fio >/dev/null 2>&1 || fio=
command -v qemu-storage-daemon >/dev/null || { echo "compare-migrate: no qemu-storage-daemon" >&2; exit 1; }
workdir=${IOPLANE_VM_WORKDIR:-/var/tmp/ioplane-vmtest}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# server_cmd SERVER: the --server-cmd exporting the disk on both sockets.
server_cmd() {
	case $1 in
	ioplane)
		local o='image=d,num-queues=2,writable=on'
		echo "exec $IOPLANE serve --iothreads 1 --image d,file=\"\$VMTEST_IMG\",format=raw --vhost-user-blk unix=\"\$VMTEST_SOCK\",$o --vhost-user-blk unix=\"\$VMTEST_SOCK2\",$o" ;;
	qsd)
		local e='node-name=d,writable=on,num-queues=2,iothread=iot0,addr.type=unix'
		echo "exec qemu-storage-daemon --object iothread,id=iot0 --blockdev driver=file,node-name=d,filename=\"\$VMTEST_IMG\" --export type=vhost-user-blk,id=src,$e,addr.path=\"\$VMTEST_SOCK\" --export type=vhost-user-blk,id=dst,$e,addr.path=\"\$VMTEST_SOCK2\"" ;;
	esac
}

# run SERVER: one migration; appends "total downtime" to $tmp/SERVER, or counts a failure.
run() {
	local log=$tmp/run.log line
	if ! timeout $((timeout + 120)) bash "$src/tests/vm/run-vm-test.sh" --perf-mb 0 \
		--perf4k-mb 0 --num-queues 2 --mem "$mem" --migrate $fio --fio-runtime 1 \
		--workdir "$workdir" --timeout "$timeout" --server-cmd "$(server_cmd "$1")" \
		>"$log" 2>&1; then
		echo "  $1: FAILED: $(grep -m1 '^RESULT' "$log" || echo 'no result')"
		sed -n '/server log/,$p' "$log" | grep -v 'run directory kept' | tail -n 5 | sed 's/^/    /'
		# The run directory (console logs of both guests, QEMU's and the server's
		# logs, the migration log) is kept with the script's log in it.
		kept=$(sed -n 's/.*run directory kept: //p' "$log")
		if [ -d "$kept" ]; then
			cp "$log" "$kept/compare-migrate.log"
			echo "    kept: $kept"
		fi
		echo x >>"$tmp/$1.failed"
		return 0
	fi
	line=$(grep -m1 'migration: completed' "$log")
	# total downtime server-CPU source-QEMU-CPU (ms; "-" when not measured)
	awk '{ t = d = "-"; sc = qc = "-"
		for (i = 1; i <= NF; i++) { split($i, kv, "=")
			if (kv[1] == "total_ms") t = kv[2]; else if (kv[1] == "downtime_ms") d = kv[2]
			else if (kv[1] == "server_cpu_ms") sc = kv[2]; else if (kv[1] == "qemu_cpu_ms") qc = kv[2] }
		print t, d, sc, qc }' <<<"$line" >>"$tmp/$1"
	echo "  $1: $line"
}

for ((r = 1; r <= reps; r++)); do
	echo "rep $r/$reps"
	run ioplane
	run qsd
done

for s in ioplane qsd; do
	[ -s "$tmp/$s" ] && continue
	echo "compare-migrate: no $s run succeeded" >&2
	exit 1
done
failed() { if [ -f "$tmp/$1.failed" ]; then wc -l <"$tmp/$1.failed"; else echo 0; fi; }
median() { sort -n | awk '{a[NR] = $1} END {print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}'; }
it=$(cut -d' ' -f1 "$tmp/ioplane" | median); id=$(cut -d' ' -f2 "$tmp/ioplane" | median)
qt=$(cut -d' ' -f1 "$tmp/qsd" | median); qd=$(cut -d' ' -f2 "$tmp/qsd" | median)
col() { cut -d' ' -f"$2" "$tmp/$1" | grep -v '^-$' | median; }
printf '\n%-10s %12s %14s %16s %16s %12s\n' server "total ms" "downtime ms" "server CPU ms" \
	"source QEMU CPU" "failed runs"
for s in ioplane qsd; do
	printf '%-10s %12s %14s %16s %16s %12s\n' $s "$(col $s 1)" "$(col $s 2)" "$(col $s 3)" \
		"$(col $s 4)" "$(failed $s)/$reps"
done
awk -v it="$it" -v qt="$qt" -v id="$id" -v qd="$qd" 'BEGIN {
	rt = it / qt; rd = (qd > 0) ? id / qd : 0
	printf "\nioplane/qsd: total %.2fx (%s), downtime %.2fx (%s)  (target <= 1.0, %s guest RAM, median of '"$reps"')\n",
		rt, rt <= 1 ? "ok" : "MISSED", rd, rd <= 1 ? "ok" : "MISSED", "'"$mem"' MiB"
}'
