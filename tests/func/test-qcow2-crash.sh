#!/bin/bash
# Crash consistency of the qcow2 driver: `ioplane serve` exports an ioplane-created qcow2
# image over NBD; an NBD client (_imgwork.py crash) sends random writes, write-zeroes, trims
# and flushes, several in flight, and kills the server with SIGKILL at a random moment.
# After each of 20 crashes (different seeds, cluster sizes and options, the same image
# carried over several crashes): qemu-img check finds no corruption (leaks are allowed;
# `ioplane img check -r leaks` repairs them, then qemu-img check is clean), and every
# request acknowledged before the last completed flush reads back intact.
# CRASH_RUNS overrides the number of crashes.
. "$(dirname "$0")/nbd-lib.sh"
. "$(dirname "$0")/img-lib.sh"

nbd_need_ioplane
[ -z "$NBD_TEST_PEER" ] || skip "NBD_TEST_PEER: this test is about ioplane's qcow2 driver"

RUNS=${CRASH_RUNS:-20}
SIZE=$((32 << 20))
WORK=$IMG_LIB_DIR/_imgwork.py
sock=$T/nbd.sock
total_leaks=0
total_flushes=0

# new_image RUN: a fresh image every 5 runs, with options varying by run.
new_image() {
	local opts
	case $(($1 / 5 % 4)) in
	0) opts=cluster_size=64k ;;
	1) opts=cluster_size=4k,refcount_bits=8 ;;
	2) opts=cluster_size=64k,extended_l2=on ;;
	3) opts=cluster_size=16k,compat=0.10 ;;
	esac
	rm -f crash.qcow2 crash.raw
	img create -q -f qcow2 -o "$opts" crash.qcow2 "$SIZE"
	echo "== new image: $opts"
}

for ((run = 0; run < RUNS; run++)); do
	[ $((run % 5)) -ne 0 ] || new_image $run
	seed=$((run * 7919 + 13))
	kill_after=$(python3 -c \
		"import random; print(round(random.Random($seed).uniform(0.2, 1.2), 3))")
	nbd_serve --image d,file=crash.qcow2,format=qcow2 --nbd unix="$sock",image=d,writable=on
	echo "run $run: seed $seed, SIGKILL after ${kill_after}s"
	# shellcheck disable=SC2046
	timeout 120 python3 "$WORK" crash "$sock" d "$SIZE" "$seed" "$NBD_PID" "$kill_after" \
		state.json $([ -f crash.raw ] && echo crash.raw) ||
		fail "run $run: the NBD client failed"
	rc=0
	wait "$NBD_PID" 2>/dev/null || rc=$?
	nbd_forget "$NBD_PID"
	# 137: the kill; anything else is a crash of its own (a sanitizer's report).
	[ "$rc" -eq 137 ] || fail "run $run: the server ended with status $rc before the kill"
	wait_unlocked crash.qcow2
	flushes=$(python3 -c 'import json; print(json.load(open("state.json"))["flushes"])')
	total_flushes=$((total_flushes + flushes))

	leaks=$(qcheck_no_corruption crash.qcow2)
	total_leaks=$((total_leaks + leaks))
	if [ "$leaks" -gt 0 ]; then
		img_status 0 check -r leaks crash.qcow2
		qcheck crash.qcow2
	fi
	qemu_raw crash.qcow2 crash.raw
	python3 "$WORK" verify state.json crash.raw || fail "run $run: flushed data lost"
	qcheck crash.qcow2
done
[ "$total_flushes" -gt 0 ] || fail "no flush ever completed: the test tested nothing"
echo "$RUNS crashes: no corruption, flushed data intact ($total_leaks leaked clusters repaired)"
