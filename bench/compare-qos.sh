#!/bin/bash
# Throttling side by side with qemu-storage-daemon, in one invocation. Both daemons get
# the same command line (--object throttle-group, --blockdev null-co and throttle, an NBD
# export on a unix socket) and the same fio runs (4 KiB random reads at depth 32 through
# fio's nbd engine). Prints one table row per metric.
#
#   1  accuracy: fio for --secs seconds (default 10, after a 1 s ramp) at iops-total 1000,
#      5000, 20000 and bps-total 50 MB/s (64 KiB reads): measured rate vs the limit, the
#      error of each daemon side by side (target: ioplane within +-2%). Then the burst:
#      iops-total=1000,iops-total-max=4000,iops-total-max-length=2: the I/Os done in the
#      first 2 s against the 8000 the burst grants, and the rate over the last --secs
#      seconds against 1000.
#   2  no throttle configured: callgrind instructions per request (null, 4 KiB reads,
#      depth 64; bench/compare-engine.sh's row 1) of this build against a build of the
#      `main` branch (target <= +1%), and of this build with its USDT probes against one
#      built with -Dusdt=false (target: unchanged, <= +1%).
#   3  throttled to 20000 IOPS on null: server CPU time (utime + stime from /proc) per I/O
#      over the measured window, ioplane against qsd (target <= 0.5x).
#   4  bench/compare-metrics.sh, when it exists, runs last.
#
#   bench/compare-qos.sh [--ioplane PATH] [--base PATH] [--nousdt PATH] [--secs N]
#                        [--rows "1 2 3 4"] [--quick]
#
# --base and --nousdt name ready-built executables for row 2; without them the script
# builds them in a scratch directory (the `main` branch from this repository's git, and
# this tree with -Dusdt=false). --quick: 2 s runs. A benchmark, not a test: it installs
# nothing, skips a row (saying why) when a tool is missing, exits 0 whether targets are
# met or not, 2 on bad usage. Every command runs under timeout; daemons are stopped on
# exit.
set -uo pipefail

src=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
IOPLANE=${IOPLANE:-$src/build/ioplane}
base=
nousdt=
secs=10
ramp=1
rows="1 2 3 4"

usage() {
	sed -n '22,23s/^# \{0,1\}//p' "$0"
	exit "$1"
}

while [ $# -gt 0 ]; do
	case "$1" in
	--ioplane) IOPLANE=$2; shift ;;
	--base) base=$2; shift ;;
	--nousdt) nousdt=$2; shift ;;
	--secs) secs=$2; shift ;;
	--rows) rows=$2; shift ;;
	--quick) secs=2 ;;
	-h | --help) usage 0 ;;
	*) echo "compare-qos.sh: unknown argument '$1'" >&2; usage 2 ;;
	esac
	shift || usage 2
done
[[ "$secs" =~ ^[1-9][0-9]*$ ]] || usage 2

tmp=$(mktemp -d /tmp/compare-qos.XXXXXX)
daemon_pid=
stop_daemon() {
	[ -n "$daemon_pid" ] || return 0
	kill -TERM "$daemon_pid" 2>/dev/null
	for _ in $(seq 100); do kill -0 "$daemon_pid" 2>/dev/null || break; sleep 0.1; done
	kill -KILL "$daemon_pid" 2>/dev/null
	wait "$daemon_pid" 2>/dev/null
	daemon_pid=
}
cleanup() {
	stop_daemon
	rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

have() { command -v "$1" >/dev/null 2>&1; }
note() { echo "# $*" >&2; }

results=()
add_row() { results+=("$(printf '%-40s %14s %14s %12s %10s  %s' "$@")"); }
skip_row() { add_row "$1" - - - - "skipped: $2"; }
print_table() {
	echo
	printf '%-40s %14s %14s %12s %10s  %s\n' metric ioplane qsd ratio target result
	printf '%s\n' "${results[@]}"
}

# ---- the daemons ----

sock=$tmp/nbd.sock
# start_daemon ioplane|qsd LIMITS: a null node behind a throttle node, exported over NBD.
start_daemon() {
	local kind=$1 limits=$2 cmd
	stop_daemon
	rm -f "$sock"
	if [ "$kind" = ioplane ]; then cmd=("$IOPLANE" serve -q); else cmd=(qemu-storage-daemon); fi
	"${cmd[@]}" --object "throttle-group,id=tg,$limits" \
		--blockdev driver=null-co,node-name=n0,size=1073741824 \
		--blockdev driver=throttle,node-name=t0,throttle-group=tg,file=n0 \
		--nbd-server addr.type=unix,addr.path="$sock" \
		--export type=nbd,id=e0,node-name=t0,name=e0 >"$tmp/$kind.log" 2>&1 &
	daemon_pid=$!
	for _ in $(seq 100); do
		[ -S "$sock" ] && return 0
		kill -0 "$daemon_pid" 2>/dev/null || break
		sleep 0.1
	done
	note "$kind did not start: $(tail -n 3 "$tmp/$kind.log")"
	return 1
}

cpu_ticks() { awk '{ print $14 + $15 }' "/proc/$daemon_pid/stat"; }

# fio_run BS RUNTIME [ARGS...]: fio's JSON in $tmp/fio.json; the daemon's CPU ticks over
# the measured window (after the ramp) in $tmp/cpu.
fio_run() {
	local bs=$1 runtime=$2 c0 c1
	shift 2
	timeout -k 5 $((runtime + ramp + 60)) fio --name=q --ioengine=nbd \
		--uri="nbd+unix:///e0?socket=$sock" --rw=randread --bs="$bs" --iodepth=32 \
		--size=1G --time_based --runtime="$runtime" --ramp_time="$ramp" \
		--output-format=json --output="$tmp/fio.json" "$@" >"$tmp/fio.log" 2>&1 &
	local fio_pid=$!
	sleep "$ramp"
	c0=$(cpu_ticks)
	wait $fio_pid || { note "fio failed: $(tail -n 3 "$tmp/fio.log")"; return 1; }
	c1=$(cpu_ticks)
	echo $((c1 - c0)) >"$tmp/cpu"
}

fio_field() { # read.iops | read.bw_bytes | read.total_ios
	python3 -c 'import json, sys
j = json.load(open(sys.argv[1]))["jobs"][0]
d, k = sys.argv[2].split(".")
print(j[d][k])' "$tmp/fio.json" "$1"
}

err_pct() { awk -v m="$1" -v l="$2" 'BEGIN { printf "%+.2f%%\n", (m - l) * 100 / l }'; }
within() { awk -v m="$1" -v l="$2" -v p="$3" 'BEGIN { e = (m - l) / l * 100; exit !(e <= p && e >= -p) }'; }

# ---- row 1 (and the CPU figures of row 3) ----

declare -A cpu_per_io
accuracy() { # NAME LIMITS BS FIELD LIMIT
	local name=$1 limits=$2 bs=$3 field=$4 limit=$5 kind m i q
	for kind in ioplane qsd; do
		start_daemon $kind "$limits" && fio_run "$bs" "$secs" || return 1
		m=$(fio_field "$field")
		[ $kind = ioplane ] && i=$m || q=$m
		cpu_per_io[$name.$kind]=$(awk -v t="$(cat "$tmp/cpu")" -v hz="$(getconf CLK_TCK)" \
			-v n="$(fio_field read.total_ios)" 'BEGIN { printf "%.2f", n ? t / hz * 1e6 / n : 0 }')
		stop_daemon
	done
	add_row "$name: rate vs limit" "$(printf '%.0f' "$i") $(err_pct "$i" "$limit")" \
		"$(printf '%.0f' "$q") $(err_pct "$q" "$limit")" - "+-2%" \
		"$(within "$i" "$limit" 2 && echo ok || echo 'NOT MET')"
}

# The I/Os done in the first LEN seconds and the mean rate over the last SECS, from an
# IOPS log averaged over 250 ms windows.
burst_figures() {
	python3 - "$1" "$2" "$3" <<'PY'
import glob, sys
prefix, length, tail = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
rows = []
for f in glob.glob(prefix + '*_iops*.log'):
    for line in open(f):
        p = [x.strip() for x in line.split(',')]
        rows.append((int(p[0]) / 1000.0, float(p[1])))
rows.sort()
end = rows[-1][0] if rows else 0
# A window is stamped at its end, a few ms late: those ending by length
# (give or take half a window) make up the first length seconds.
first = sum(v * 0.25 for t, v in rows if t < length + 0.125)
last = [v for t, v in rows if t > end - tail]
print('%.0f %.1f' % (first, sum(last) / len(last) if last else 0))
PY
}

burst() {
	local avg=1000 max=4000 len=2 kind run f i_first i_tail q_first q_tail
	run=$((3 * len + secs))
	for kind in ioplane qsd; do
		start_daemon $kind "limits.iops-total=$avg,limits.iops-total-max=$max,limits.iops-total-max-length=$len" || return 1
		rm -f "$tmp"/burst_*
		# No ramp here: the burst is the start.
		ramp=0 fio_run 4k $run --write_iops_log="$tmp/burst_$kind" --log_avg_msec=250 || return 1
		f=$(burst_figures "$tmp/burst_$kind" $len $secs)
		if [ $kind = ioplane ]; then read -r i_first i_tail <<<"$f"; else read -r q_first q_tail <<<"$f"; fi
		stop_daemon
	done
	add_row "burst: I/Os in first ${len}s vs $((max * len))" "$i_first" "$q_first" \
		"$(awk -v a="$i_first" -v b=$((max * len)) 'BEGIN { printf "%.3f", a / b }')" ">=0.95" \
		"$(awk -v a="$i_first" -v b=$((max * len)) 'BEGIN { exit !(a / b >= 0.95) }' && echo ok || echo 'NOT MET')"
	add_row "burst: then rate vs $avg" "$i_tail $(err_pct "$i_tail" $avg)" \
		"$q_tail $(err_pct "$q_tail" $avg)" - "+-2%" \
		"$(within "$i_tail" $avg 2 && echo ok || echo 'NOT MET')"
}

row1() {
	if ! have fio || ! fio --enghelp 2>/dev/null | grep -qw nbd; then
		skip_row "row 1: accuracy" "fio with the nbd engine not installed"; return
	fi
	if ! have qemu-storage-daemon; then skip_row "row 1: accuracy" "no qemu-storage-daemon"; return; fi
	for l in 1000 5000 20000; do
		accuracy "iops-total=$l" "limits.iops-total=$l" 4k read.iops $l ||
			skip_row "iops-total=$l" "a run failed"
	done
	accuracy "bps-total=50MB/s" "limits.bps-total=50000000" 64k read.bw_bytes 50000000 ||
		skip_row "bps-total=50MB/s" "a run failed"
	burst || skip_row "burst" "a run failed"
}

# ---- row 2 ----

build_tree() { # SRC_DIR BUILD_DIR [MESON_ARGS...]
	local s=$1 b=$2
	shift 2
	timeout -k 5 1800 meson setup "$b" "$s" "$@" >"$tmp/build.log" 2>&1 &&
		timeout -k 5 1800 ninja -C "$b" ioplane >>"$tmp/build.log" 2>&1
}

ir_per_req() { # IOPLANE_PATH: compare-engine.sh's row 1, ioplane's column
	"$src/bench/compare-engine.sh" --ioplane "$1" --rows 1 --reps 1 2>/dev/null |
		awk '/^instr\/request/ { print substr($0, 46) }' | awk '{ print $1 }'
}

ir_row() { # NAME THIS BASE
	local a b
	a=$(ir_per_req "$2")
	b=$(ir_per_req "$3")
	if [ -z "$a" ] || [ -z "$b" ] || [ "$a" = - ] || [ "$b" = - ]; then
		skip_row "$1" "callgrind gave no figure"; return
	fi
	add_row "$1" "$a" "$b (base)" "$(awk -v a="$a" -v b="$b" 'BEGIN { printf "%.4f", a / b }')" \
		"<=1.01" "$(awk -v a="$a" -v b="$b" 'BEGIN { exit !(a / b <= 1.01) }' && echo ok || echo 'NOT MET')"
}

row2() {
	if ! have valgrind; then skip_row "row 2: instr/request" "valgrind not installed"; return; fi
	if [ -z "$base" ]; then
		note "building the main branch for row 2"
		mkdir -p "$tmp/base-src"
		if git -C "$src" archive main | tar -x -C "$tmp/base-src" &&
			build_tree "$tmp/base-src" "$tmp/base-build"; then
			base=$tmp/base-build/ioplane
		else
			skip_row "instr/request vs main" "cannot build main: $(tail -n 2 "$tmp/build.log")"
		fi
	fi
	[ -n "$base" ] && ir_row "instr/request no throttle vs main" "$IOPLANE" "$base"
	if [ -z "$nousdt" ]; then
		note "building this tree with -Dusdt=false for row 2"
		if build_tree "$src" "$tmp/nousdt-build" -Dusdt=false; then
			nousdt=$tmp/nousdt-build/ioplane
		else
			skip_row "instr/request probes vs none" "cannot build: $(tail -n 2 "$tmp/build.log")"
		fi
	fi
	[ -n "$nousdt" ] && ir_row "instr/request USDT probes vs none" "$IOPLANE" "$nousdt"
}

# ---- row 3 ----

row3() {
	local i=${cpu_per_io[iops-total=20000.ioplane]:-} q=${cpu_per_io[iops-total=20000.qsd]:-}
	if [ -z "$i" ] || [ -z "$q" ]; then
		skip_row "CPU us/I/O at 20000 IOPS" "row 1's 20000 IOPS run is needed"; return
	fi
	add_row "CPU us/I/O throttled 20000 IOPS" "$i" "$q" \
		"$(awk -v a="$i" -v b="$q" 'BEGIN { printf "%.3f", (b > 0 ? a / b : 0) }')" "<=0.5" \
		"$(awk -v a="$i" -v b="$q" 'BEGIN { exit !(b > 0 && a / b <= 0.5) }' && echo ok || echo 'NOT MET')"
}

# ---- main ----

if [ ! -x "$IOPLANE" ]; then
	echo "compare-qos.sh: $IOPLANE is not built (ninja -C build, or --ioplane PATH)" >&2
	exit 1
fi
note "ioplane: $IOPLANE; peer: $(qemu-storage-daemon --version 2>/dev/null | head -n 1); $(fio --version 2>/dev/null)"
note "runs: ${secs}s after a ${ramp}s ramp; $(nproc) CPUs; kernel $(uname -r)"
start_s=$SECONDS
for r in $rows; do
	case $r in
	1) row1 ;;
	2) row2 ;;
	3) [[ " $rows " == *" 1 "* ]] || row1; row3 ;;
	4) ;;
	*) echo "compare-qos.sh: no row $r" >&2; exit 2 ;;
	esac
done
print_table
if [[ " $rows " == *" 4 "* ]]; then
	if [ -x "$src/bench/compare-metrics.sh" ] || [ -f "$src/bench/compare-metrics.sh" ]; then
		echo
		note "row 4: bench/compare-metrics.sh"
		IOPLANE=$IOPLANE bash "$src/bench/compare-metrics.sh" $([ "$secs" -le 2 ] && echo --quick)
	else
		echo "row 4: skipped: bench/compare-metrics.sh does not exist yet"
	fi
fi
note "total $((SECONDS - start_s)) s"
