#!/bin/bash
# vhost-user-blk and adaptive polling: an interrupt-driven driver (`ioplane bench
# --vhost-user --poll-max-ns 0`, which sleeps until the call eventfd fires) sends its next
# request only after it woke up, so the back-end must not busy-poll for it after each
# interrupt; a polling driver (--poll-max-ns 200000, which asks for no interrupts while it
# polls) is still polled for. Counts from the iothread's loop statistics (logged at exit
# with IOPLANE_LOG=debug): busy-poll attempts (hits + misses) per request, depth 1, null
# export. Counts, not times.
. "$(dirname "${BASH_SOURCE[0]}")/vhost-lib.sh"

sock=$FUNC_TMP/vhost.sock
n=4000

# polls GUEST_POLL_NS: busy-poll attempts of one server over n requests of one guest.
polls() {
	local log line
	# A generous poll limit (1 ms), so that a slow machine still polls the polling driver.
	IOPLANE_LOG=debug vhost_serve "$sock" --iothreads 1 --poll-max-ns 1000000 \
		--image d,driver=null,size=64M --vhost-user-blk unix="$sock",image=d,num-queues=1
	vhost_bench --vhost-user "$sock" --num-queues 1 -d 1 -c "$n" --random -s 4096 -q \
		--poll-max-ns "$1" >/dev/null || fail "bench --poll-max-ns $1 failed"
	vhost_stop "$VHOST_PID"
	log=${vhost_logs[${#vhost_logs[@]} - 1]}
	line=$(grep -m1 'iothread0: .* polling' "$log") || fail "no loop statistics in $log"
	sed -n 's/.*polling \([0-9]*\) hits \([0-9]*\) misses.*/\1 \2/p' <<<"$line" |
		awk '{print $1 + $2}'
}

irq=$(polls 0)
echo "interrupt-driven driver: $irq busy polls for $n requests"
[ "$irq" -lt $((n / 20)) ] || fail "the back-end busy-polled $irq times for $n requests of an interrupt-driven driver"

poll=$(polls 200000)
echo "polling driver: $poll busy polls for $n requests"
[ "$poll" -gt 0 ] || fail "the back-end never polled a polling driver's queue"
echo PASS
