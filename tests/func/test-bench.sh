#!/bin/bash
# Functional tests of `ioplane bench` with real peers: data it writes is checked with
# qemu-io, the offsets it visits are compared with qemu-img bench writing the same
# pattern, its 'Sending ...' lines with qemu-img bench's, and bad command lines must fail
# with one message. Every engine (io_uring, native, threads) under both loop backends.
# Plain bash, one process; every command runs under a time limit (lib.sh).
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

need qemu-img qemu-io cmp python3

IMG=$FUNC_TMP/a.raw
IMG2=$FUNC_TMP/b.raw
NULL_QEMU="--image-opts driver=null-co,size=1G"
BACKENDS=(uring epoll)
ENGINES=(io_uring native threads)
CACHES=(writeback)
if have_odirect; then
	CACHES+=(none)
else
	echo "note: no O_DIRECT in $FUNC_TMP; cache=none not tested"
fi

new_img() { # new_img FILE SIZE
	rm -f "$1"
	qemu-img create -q -f raw "$1" "$2"
}

# qio FILE CMD...: each CMD a qemu-io command; all must succeed and patterns match.
qio() {
	local f=$1 c
	local -a args=()
	shift
	for c in "$@"; do
		args+=(-c "$c")
	done
	run_ok qemu-io -f raw "${args[@]}" "$f"
	if grep -q "verification failed" "$OUT" "$ERR"; then
		cat "$OUT" "$ERR" >&2
		fail "qemu-io pattern check failed on ${f##*/}: $*"
	fi
}

bench() { run_ok "$IOPLANE" bench "$@"; }

echo "== the command line of the executable"
run_ok "$IOPLANE" --help
expect_grep "$OUT" '^ +bench '
expect_grep "$OUT" '^ +serve .*NBD and vhost-user-blk'
run_ok "$IOPLANE" --version
version=$(sed -n "s/^ *version *: *'\([^']*\)'.*/\1/p" "$IOPLANE_SRC/meson.build" | head -n 1)
[ -n "$version" ] || fail "no version in meson.build (test bug)"
expect_line "$OUT" "ioplane version $version"
run_status 1 "$IOPLANE" no-such-command
expect_grep "$ERR" "unknown command 'no-such-command'"
[ "$(wc -l <"$ERR")" -eq 1 ] || fail "more than one line for an unknown command"
run_status 1 "$IOPLANE"
run_status 1 "$IOPLANE" img no-such-command
run_ok "$IOPLANE" bench --help
expect_grep "$OUT" '^Usage: ioplane bench'

echo "== 'Sending ...' lines identical to qemu-img bench's"
opt_sets=(
	"-c 1000"
	"-c 100 -d 16 -s 512 -S 1024 -o 4096"
	"-c 300 -d 1 -s 64k -S 1M -o 1G"
	"-c 0"
	"-c 200 -w --pattern=0x5a"
	"-c 500 -w --flush-interval=64"
	"-c 500 -w -d 8 --flush-interval=100 --no-drain"
	"-c 100 -s 3k -S 0 -t none -n"
	"-c 100 -i threads -t unsafe -q"
)
for opts in "${opt_sets[@]}"; do
	# -o 1G is the end of the 1G image: qemu-img fails the first request
	# after printing its lines, and so must we.
	want=0
	[[ "$opts" == *"-o 1G"* ]] && want=1
	run_status $want qemu-img bench $opts $NULL_QEMU
	grep '^Sending' "$OUT" >"$FUNC_TMP/qemu.sending" || true
	run_status $want "$IOPLANE" bench $opts null:size=1G
	grep '^Sending' "$OUT" >"$FUNC_TMP/ioplane.sending" || true
	if [[ "$opts" == *-q* ]]; then
		# qemu-img 7.2 ignores -q in bench; ours is quiet.
		[ ! -s "$OUT" ] || fail "-q printed: $(cat "$OUT")"
		continue
	fi
	[ -s "$FUNC_TMP/qemu.sending" ] || fail "qemu-img printed no Sending line for $opts"
	if ! cmp -s "$FUNC_TMP/qemu.sending" "$FUNC_TMP/ioplane.sending"; then
		diff "$FUNC_TMP/qemu.sending" "$FUNC_TMP/ioplane.sending" >&2 || true
		fail "Sending lines differ for: $opts"
	fi
done

echo "== our extra lines"
bench -c 2000 -d 8 null:size=1G
expect_grep "$OUT" '^Run completed in [0-9]+\.[0-9]{3} seconds\.$'
expect_grep "$OUT" '^IOPS: [0-9]+, bandwidth: [0-9]+\.[0-9]{2} MiB/s$'
expect_grep "$OUT" '^Latency: mean [0-9.]+ us, p50 [0-9.]+ us, p99 [0-9.]+ us, p99.9 [0-9.]+ us$'
awk '/^Latency:/ { p50 = $6; p99 = $9; p999 = $12
	if (!(p50 <= p99 && p99 <= p999)) { print "percentiles out of order: " $0; exit 1 } }' \
	"$OUT" || fail "latency percentiles not ordered"
[ "$(wc -l <"$OUT")" -eq 4 ] || fail "expected 4 lines of output, got $(wc -l <"$OUT")"
run_ok "$IOPLANE" img bench -c 10 null:size=1M
expect_line "$OUT" "Sending 10 read requests, 4096 bytes each, 64 in parallel (starting at offset 0, step size 4096)"

echo "== bad command lines: exit 1 and one message"
new_img "$IMG" 1M
bad_sets=(
	"-c abc null:size=1G"
	"-c -1 null:size=1G"
	"-c 4294967296 null:size=1G"
	"-d 0 null:size=1G"
	"-s 1x null:size=1G"
	"-s 3G null:size=1G"
	"-S -4k null:size=1G"
	"-o 1y null:size=1G"
	"-t bogus null:size=1G"
	"-i bogus null:size=1G"
	"--pattern=256 -w null:size=1G"
	"--flush-interval=64 null:size=1G"
	"-w --flush-interval=8 -d 16 null:size=1G"
	"--seed=x --random null:size=1G"
	"--poll-max-ns=-1 null:size=1G"
	"--no-such-option null:size=1G"
	"-x null:size=1G"
	"-c"
	""
	"null:size=1G null:size=1G"
	"$FUNC_TMP/does-not-exist"
	"null:size=bogus"
	"null:size=1G,no-such-key=1"
	"-f no-such-format $IMG"
	"-o 2G null:size=1G"
	"-w -f raw -o 1M $IMG" # -f: a probed raw image adds qemu-img's warning line
)
for opts in "${bad_sets[@]}"; do
	run_status 1 "$IOPLANE" bench $opts
	[ "$(wc -l <"$ERR")" -eq 1 ] || fail "not one line of message for: bench $opts: $(cat "$ERR")"
	head -n 1 "$ERR" | grep -q '^ioplane bench: ' ||
		fail "message for '$opts' does not name the tool: $(head -n 1 "$ERR")"
	[ ! -s "$OUT" ] || grep -q '^Sending' "$OUT" || fail "stray output for '$opts'"
done

echo "== offsets, step and -o: where data must and must not be"
# -o 8k -S 64k: requests at 8k, 72k, 136k, 200k.
new_img "$IMG" 1M
bench -w --pattern=0x5a -c 4 -d 2 -s 4k -S 64k -o 8k "$IMG"
qio "$IMG" "read -P 0 0 8k" "read -P 0x5a 8k 4k" "read -P 0 12k 60k" "read -P 0x5a 72k 4k" \
	"read -P 0 76k 60k" "read -P 0x5a 136k 4k" "read -P 0 140k 60k" "read -P 0x5a 200k 4k" \
	"read -P 0 204k 820k"
# Wrapping: offset %= size - bufsize (60k here): 0, 16k, 32k, 48k, then 4k, 20k.
new_img "$IMG" 64k
bench -w --pattern=0x21 -c 6 -d 1 -s 4k -S 16k "$IMG"
qio "$IMG" "read -P 0x21 0 8k" "read -P 0 8k 8k" "read -P 0x21 16k 8k" "read -P 0 24k 8k" \
	"read -P 0x21 32k 4k" "read -P 0 36k 12k" "read -P 0x21 48k 4k" "read -P 0 52k 12k"
# The last buffer-sized block is never reached by sequential offsets.
new_img "$IMG" 16k
bench -w --pattern=0x42 -c 10 -d 3 -s 4k "$IMG"
qio "$IMG" "read -P 0x42 0 12k" "read -P 0 12k 4k"
# Image no larger than the buffer: every request at offset 0.
new_img "$IMG" 8k
bench -w --pattern=0x43 -c 3 -s 8k "$IMG"
qio "$IMG" "read -P 0x43 0 8k"

echo "== the same offsets as qemu-img bench (same pattern, images compared)"
# Runs that do not wrap: qemu-img 7.2 wraps modulo the image size (and so can run past
# its end); we wrap modulo size - bufsize like later qemu, checked above with qemu-io.
oracle_sets=(
	"-c 20 -s 4k -S 12k -o 5k"
	"-c 100 -d 3 -s 1k -S 2k -o 1k"
	"-c 3 -d 5 -s 64k"
	"-c 20 -s 512 -S 10k"
	"-c 60 -d 4 --flush-interval=16"
	"-c 60 -d 4 --flush-interval=16 --no-drain"
	"-c 33 -d 2 -s 1k -S 0 -o 200k"
)
for be in "${BACKENDS[@]}"; do
	for opts in "${oracle_sets[@]}"; do
		new_img "$IMG" 256k
		new_img "$IMG2" 256k
		run_ok qemu-img bench -f raw -w --pattern=0xc3 $opts "$IMG"
		IOPLANE_LOOP_BACKEND=$be bench -w --pattern=0xc3 $opts "$IMG2"
		cmp -s "$IMG" "$IMG2" || fail "[$be] image differs from qemu-img bench's for: $opts"
	done
done

echo "== every engine, cache mode and loop backend writes and reads"
pat=16
for be in "${BACKENDS[@]}"; do
	for aio in "${ENGINES[@]}"; do
		for cache in "${CACHES[@]}" writethrough unsafe; do
			pat=$((pat + 1))
			new_img "$IMG" 1M
			export IOPLANE_LOOP_BACKEND=$be
			bench -w --pattern=$pat -c 8 -d 4 -s 64k -t $cache -i $aio "$IMG"
			qio "$IMG" "read -P $pat 0 512k" "read -P 0 512k 512k"
			bench -c 2000 -d 16 -s 4k -t $cache -i $aio "$IMG"
			expect_grep "$OUT" '^Run completed'
			bench -w --flush-interval=8 -d 4 -c 64 -s 4k -t $cache -i $aio \
				--pattern=$((pat + 100)) "$IMG"
			qio "$IMG" "read -P $((pat + 100)) 0 252k" "read -P $pat 256k 256k"
			unset IOPLANE_LOOP_BACKEND
		done
	done
done

echo "== --flush-interval: flushes where qemu-img bench sends them"
# 64 writes, depth 4, interval 16: with draining, a flush when 48, 32, 16 and 0 requests
# are left to submit; without, one at 48, 32 and 16 and one per completion once nothing is
# left (4). Plus the flush when the image is closed. The threads engine flushes with
# fdatasync(2) on a pool worker, which strace -f counts. (LeakSanitizer cannot run under
# ptrace: leaks are checked by the other runs.)
count_flushes() {
	run_ok strace -f -qq -e trace=fdatasync,fsync -o "$FUNC_TMP/strace" \
		env ASAN_OPTIONS="${ASAN_OPTIONS:-}:detect_leaks=0" "$IOPLANE" bench -q -w -c 64 -d 4 --flush-interval=16 -i threads "$@" "$IMG"
	grep -cE '^[0-9]+ +(fdatasync|fsync)\(' "$FUNC_TMP/strace" || true
}
if command -v strace >/dev/null 2>&1; then
	new_img "$IMG" 1M
	[ "$(count_flushes)" -eq 5 ] || fail "drained flushes: $(count_flushes), expected 5"
	[ "$(count_flushes --no-drain)" -eq 8 ] || fail "undrained flushes: expected 8"
	[ "$(count_flushes -t unsafe)" -eq 0 ] || fail "cache=unsafe flushed"
else
	echo "note: strace not installed; flush counts not checked"
fi

echo "== --random: aligned offsets inside the image, reproducible by seed"
check_blocks() { # FILE BLOCK PATTERN: each block all PATTERN or all zero; prints written
	python3 - "$@" <<'EOF'
import sys
path, bs, pat = sys.argv[1], int(sys.argv[2]), int(sys.argv[3], 0)
data = open(path, "rb").read()
written = 0
for i in range(0, len(data), bs):
    blk = data[i:i + bs]
    if blk == bytes([pat]) * len(blk):
        written += 1
    elif blk != bytes(len(blk)):
        sys.exit("block at %d is neither all 0x%02x nor zero" % (i, pat))
print(written)
EOF
}
for be in "${BACKENDS[@]}"; do
	new_img "$IMG" 1M
	new_img "$IMG2" 1M
	IOPLANE_LOOP_BACKEND=$be bench -w --random --seed=7 --pattern=0x77 -c 100 -d 8 -s 4k "$IMG"
	n=$(check_blocks "$IMG" 4096 0x77) || fail "[$be] --random wrote unaligned data"
	[ "$n" -ge 20 ] && [ "$n" -le 100 ] || fail "[$be] --random wrote $n distinct blocks of 100"
	IOPLANE_LOOP_BACKEND=$be bench -w --random --seed=7 --pattern=0x77 -c 100 -d 8 -s 4k "$IMG2"
	cmp -s "$IMG" "$IMG2" || fail "[$be] the same --seed gave different offsets"
	new_img "$IMG2" 1M
	bench -w --random --seed=8 --pattern=0x77 -c 100 -d 8 -s 4k "$IMG2"
	! cmp -s "$IMG" "$IMG2" || fail "different seeds gave the same offsets"
done
# Random offsets start at -o and stay inside the image.
new_img "$IMG" 1M
bench -w --random --pattern=0x78 -c 200 -s 8k -o 512k "$IMG"
qio "$IMG" "read -P 0 0 512k"
n=$(check_blocks "$IMG" 8192 0x78) || fail "--random -o wrote unaligned data"
[ "$n" -ge 10 ] || fail "--random -o wrote only $n blocks"

echo "== null target variants"
for be in "${BACKENDS[@]}"; do
	export IOPLANE_LOOP_BACKEND=$be
	bench -c 200 -d 4 "null:size=1G,mode=threads,latency-ns=2000"
	bench -c 200 -d 4 "null:size=1G,latency-ns=2000"
	bench -c 200 -d 1 --poll-max-ns=0 "null:size=1G,mode=threads"
	bench -c 200 -d 4 -w "null:size=64M,read-zeroes=on"
	bench -c 100 --random "null:size=1M"
	unset IOPLANE_LOOP_BACKEND
done

echo "PASS"
