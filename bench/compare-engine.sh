#!/bin/bash
# The block engine side by side with its peers, in one invocation: `ioplane bench` against
# `qemu-img bench` and fio on the same targets. Each figure is the median of --reps runs
# (default 3) that alternate between ioplane and the peer (the order flips every rep).
# Prints one table row per metric: ioplane, peer, ratio, target, ok / NOT MET.
#
#   1  instructions per request, null target, 4 KiB reads, depth 64: the marginal Ir under
#      `valgrind --tool=callgrind` between -c 20000 and -c 120000 (startup cancels out);
#      ioplane `null:size=1G` vs `qemu-img bench --image-opts driver=null-co,size=1G`.
#   2  IOPS, 4 KiB O_DIRECT random reads at depth 64 of a 1 GiB raw file on a disk
#      (--dir, default /var/tmp; not tmpfs): ioplane -i io_uring vs fio io_uring, and
#      ioplane -i native vs fio libaio; same file, same number of I/Os.
#   3  system calls per I/O at depth 64 (`strace -c -f`, total calls / requests):
#      ioplane vs qemu-img bench on the null target, and on the file with io_uring, O_DIRECT.
#   4  mean latency at depth 1 (elapsed / requests): the threads engine reading a file in
#      /dev/shm, ioplane vs `qemu-img bench -t writeback -i threads`; and ioplane alone on
#      null mode=threads,latency-ns=30000 with polling on (target absolute; qemu-img's
#      null-co with the same latency-ns is shown for reference).
#
#   bench/compare-engine.sh [--ioplane PATH] [--reps N] [--dir DIR] [--file PATH]
#                           [--rows "1 2 3 4"] [--quick]
#
# A benchmark, not a test: it installs nothing, skips a row (saying why) when a tool is
# missing, exits 0 whether targets are met or not, 2 on bad usage. Every command runs under
# timeout and the whole run stays under 10 minutes (rows left when the budget is spent are
# skipped). The 1 GiB file it creates is deleted on exit; one given with --file is kept.
set -uo pipefail

src=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
IOPLANE=${IOPLANE:-$src/build/ioplane}
reps=3
dir=/var/tmp
file=
rows="1 2 3 4"
quick=0
budget=540     # no new metric starts after this many seconds
hard_limit=585 # and no command runs past this
cmd_timeout=150

usage() {
	sed -n '20,21s/^# \{0,1\}//p' "$0"
	exit "$1"
}

while [ $# -gt 0 ]; do
	case "$1" in
	--ioplane) IOPLANE=$2; shift ;;
	--reps) reps=$2; shift ;;
	--dir) dir=$2; shift ;;
	--file) file=$2; shift ;;
	--rows) rows=$2; shift ;;
	--quick) quick=1 ;;
	-h | --help) usage 0 ;;
	*) echo "compare-engine.sh: unknown argument '$1'" >&2; usage 2 ;;
	esac
	shift || usage 2
done
[[ "$reps" =~ ^[1-9][0-9]*$ ]] || usage 2

# Request counts: large enough that startup and timer resolution do not matter.
cg_lo=20000 cg_hi=120000
file_ios=200000
strace_null=100000
strace_file=50000
lat_ios=20000
if [ $quick -eq 1 ]; then
	reps=1 file_ios=50000 strace_null=20000 strace_file=10000 lat_ios=5000
fi

start_s=$SECONDS
tmp=$(mktemp -d /tmp/compare-engine.XXXXXX)
made_file=
cleanup() {
	[ -n "$made_file" ] && rm -f "$made_file"
	rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

have() { command -v "$1" >/dev/null 2>&1; }
note() { echo "# $*" >&2; }

# ---- table ----

results=()

# row METRIC IOPLANE PEER TARGET: TARGET is "<=X" or ">=X" on the ratio ioplane/peer, or
# "abs<=X" on ioplane's own value.
row() {
	local metric=$1 a=$2 p=$3 target=$4
	results+=("$(awk -v m="$metric" -v a="$a" -v p="$p" -v t="$target" 'BEGIN {
		abs = (t ~ /^abs/); tt = t; sub(/^abs/, "", tt)
		op = substr(tt, 1, 2); lim = substr(tt, 3) + 0
		v = a + 0
		if (abs) r = "-"
		else if (p + 0 == 0) { r = (a + 0 == 0) ? "0" : "inf"; v = (a + 0 == 0) ? 0 : 1e300 }
		else { v = a / p; r = sprintf("%.3f", v) }
		ok = (op == "<=") ? (v <= lim) : (v >= lim)
		printf "%-44s %12s %12s %8s %10s  %s", m, a, p, r, t, ok ? "ok" : "NOT MET"
	}')")
}

skip_row() {
	results+=("$(printf '%-44s %12s %12s %8s %10s  %s' "$1" - - - - "skipped: $2")")
}

print_table() {
	echo
	printf '%-44s %12s %12s %8s %10s  %s\n' metric ioplane peer ratio target result
	printf '%s\n' "${results[@]}"
}

# ---- helpers ----

median() {
	printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 } END {
		if (NR == 0) exit 1
		if (NR % 2) print v[(NR + 1) / 2]; else printf "%.6g\n", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}

over_budget() {
	[ $((SECONDS - start_s)) -ge $budget ]
}

# run LOG CMD...: run under timeout, output to LOG; fails on error or timeout. No command
# outlives the whole run's deadline (10 minutes less a margin).
run() {
	local log=$1 limit=$cmd_timeout left
	shift
	left=$((start_s + hard_limit - SECONDS))
	[ $left -lt $limit ] && limit=$left
	if [ $limit -le 1 ]; then
		echo "time budget spent" >"$log"
		return 1
	fi
	timeout -k 5 $limit "$@" >"$log" 2>&1
}

# alternate N NAME_A CMD_A NAME_B CMD_B: run the two shell functions in alternating order,
# N times each; their outputs (one number per run) land in $tmp/NAME.vals.
alternate() {
	local n=$1 fa=$2 fb=$3 i v
	: >"$tmp/$fa.vals"
	: >"$tmp/$fb.vals"
	for ((i = 0; i < n; i++)); do
		for f in $([ $((i % 2)) -eq 0 ] && echo "$fa $fb" || echo "$fb $fa"); do
			v=$($f) || { note "$f failed: $(tail -n 3 "$tmp/last.log" 2>/dev/null)"; return 1; }
			[ -n "$v" ] || { note "$f printed no result"; return 1; }
			echo "$v" >>"$tmp/$f.vals"
		done
	done
}

vals() { median $(cat "$tmp/$1.vals"); }

# ---- measurements: each prints one number ----

ioplane_iops() { awk '/^IOPS:/ { sub(",", "", $2); print $2 }' "$1"; }
qemu_secs() { awk '/^Run completed in/ { print $4 }' "$1"; }

callgrind_ir() {
	local log=$tmp/last.log
	run "$log" valgrind --tool=callgrind --callgrind-out-file=/dev/null "$@" || return 1
	awk '/Collected :/ { print $NF }' "$log"
}

# Marginal instructions per request between cg_lo and cg_hi requests.
cg_per_req() {
	local tool=$1 lo hi
	shift
	lo=$(callgrind_ir "$tool" bench -c $cg_lo "$@") || return 1
	hi=$(callgrind_ir "$tool" bench -c $cg_hi "$@") || return 1
	awk -v a="$lo" -v b="$hi" -v n=$((cg_hi - cg_lo)) 'BEGIN { printf "%.1f\n", (b - a) / n }'
}
m1_ioplane() { cg_per_req "$IOPLANE" -q -d 64 null:size=1G; }
m1_qemu() { cg_per_req qemu-img -d 64 --image-opts driver=null-co,size=1G; }

syscalls_per_io() {
	local n=$1 log=$tmp/last.log
	shift
	run "$log" strace -c -f -o "$tmp/strace.out" "$@" || return 1
	awk -v n="$n" '$NF == "total" { printf "%.4f\n", $4 / n }' "$tmp/strace.out"
}
m3n_ioplane() { syscalls_per_io $strace_null "$IOPLANE" bench -q -d 64 -c $strace_null null:size=1G; }
m3n_qemu() {
	syscalls_per_io $strace_null qemu-img bench -d 64 -c $strace_null \
		--image-opts driver=null-co,size=1G
}
m3f_ioplane() {
	syscalls_per_io $strace_file "$IOPLANE" bench -q -f raw -d 64 -c $strace_file -t none \
		-i io_uring "$file"
}
m3f_qemu() {
	syscalls_per_io $strace_file qemu-img bench -f raw -d 64 -c $strace_file -t none \
		-i io_uring "$file"
}

ioplane_iops_run() {
	local log=$tmp/last.log
	run "$log" "$IOPLANE" bench "$@" || return 1
	ioplane_iops "$log"
}
fio_iops_run() {
	local engine=$1 log=$tmp/last.log
	run "$log" fio --name=cmp --filename="$file" --ioengine="$engine" --direct=1 \
		--rw=randread --bs=4k --iodepth=64 --size=1G --io_size=$((file_ios * 4096)) \
		--norandommap --randrepeat=0 --output-format=json || return 1
	python3 -c 'import json,sys; print("%.0f" % json.load(open(sys.argv[1]))["jobs"][0]["read"]["iops"])' \
		"$log" 2>/dev/null || sed -n '/"read"/,/iops"/s/.*"iops" : \([0-9.]*\).*/\1/p' "$log" | head -n 1
}
m2u_ioplane() { ioplane_iops_run -f raw -d 64 -c $file_ios -t none -i io_uring --random "$file"; }
m2u_fio() { fio_iops_run io_uring; }
m2n_ioplane() { ioplane_iops_run -f raw -d 64 -c $file_ios -t none -i native --random "$file"; }
m2n_fio() { fio_iops_run libaio; }

# Mean latency in µs at depth 1: elapsed / requests, the same formula for both tools.
lat_ioplane() {
	local iops
	iops=$(ioplane_iops_run -d 1 -c $lat_ios "$@") || return 1
	awk -v i="$iops" 'BEGIN { if (i > 0) printf "%.2f\n", 1e6 / i }'
}
lat_qemu() {
	local log=$tmp/last.log s
	run "$log" qemu-img bench -d 1 -c $lat_ios "$@" || return 1
	s=$(qemu_secs "$log")
	awk -v s="$s" -v n=$lat_ios 'BEGIN { printf "%.2f\n", s * 1e6 / n }'
}
m4t_ioplane() { lat_ioplane -f raw -i threads -t writeback "$shm_file"; }
m4t_qemu() { lat_qemu -f raw -i threads -t writeback "$shm_file"; }
m4n_ioplane() { lat_ioplane --poll-max-ns=32768 "null:size=1G,mode=threads,latency-ns=30000"; }
m4n_qemu() { lat_qemu --image-opts driver=null-co,size=1G,latency-ns=30000; }

# compare METRIC TARGET A B: alternate A and B, add the row.
compare() {
	local metric=$1 target=$2 a=$3 b=$4
	if over_budget; then
		skip_row "$metric" "time budget spent"
		return
	fi
	note "measuring: $metric"
	if alternate "$reps" "$a" "$b"; then
		row "$metric" "$(vals "$a")" "$(vals "$b")" "$target"
	else
		skip_row "$metric" "a run failed (see above)"
	fi
}

# ---- set-up ----

is_asan() { ldd "$1" 2>/dev/null | grep -q libasan; }

# Sets $file, or $file_err to why there is none. Not in a subshell: it sets globals.
file_err="not prepared"
prepare_file() {
	file_err=
	if [ -n "$file" ]; then
		[ -r "$file" ] || file_err="cannot read $file"
		return
	fi
	if [ "$(stat -f -c %T "$dir" 2>/dev/null)" = tmpfs ]; then
		file_err="$dir is tmpfs (no O_DIRECT, no disk); pass --dir or --file"
		return
	fi
	if ! file=$(mktemp "$dir/compare-engine.XXXXXX.raw"); then
		file_err="cannot create a file in $dir"
		return
	fi
	made_file=$file
	note "writing a 1 GiB file $file"
	# Written, not sparse: reads of holes would not reach the disk.
	if ! timeout 180 dd if=/dev/zero of="$file" bs=1M count=1024 oflag=direct conv=fsync \
		status=none 2>"$tmp/dd.log"; then
		file_err="cannot write $file: $(head -n 1 "$tmp/dd.log")"
	fi
}

# ---- rows ----

row1() {
	local m="instr/request null 4k read qd64 (callgrind)"
	if ! have valgrind; then skip_row "$m" "valgrind not installed"
	elif ! have qemu-img; then skip_row "$m" "qemu-img not installed"
	elif is_asan "$IOPLANE"; then skip_row "$m" "ioplane is a sanitizer build"
	else compare "$m" "<=0.25" m1_ioplane m1_qemu
	fi
}

row2() {
	local m1="IOPS 4k randread qd64 O_DIRECT io_uring/fio" m2="IOPS 4k randread qd64 O_DIRECT native/fio"
	if ! have fio; then
		skip_row "$m1" "fio not installed"; skip_row "$m2" "fio not installed"; return
	fi
	if [ -n "$file_err" ]; then
		skip_row "$m1" "$file_err"; skip_row "$m2" "$file_err"; return
	fi
	compare "$m1" ">=0.95" m2u_ioplane m2u_fio
	compare "$m2" ">=0.95" m2n_ioplane m2n_fio
}

row3() {
	local m1="syscalls/IO null qd64 vs qemu-img" m2="syscalls/IO file io_uring qd64 vs qemu-img"
	if ! have strace; then
		skip_row "$m1" "strace not installed"; skip_row "$m2" "strace not installed"; return
	fi
	if ! have qemu-img; then
		skip_row "$m1" "qemu-img not installed"; skip_row "$m2" "qemu-img not installed"; return
	fi
	compare "$m1" "<=0.02" m3n_ioplane m3n_qemu
	if [ -n "$file_err" ]; then
		skip_row "$m2" "$file_err"; return
	fi
	compare "$m2" "<=0.5" m3f_ioplane m3f_qemu
}

row4() {
	local m1="mean lat us, threads, /dev/shm file, qd1" m2="mean lat us, null threads 30us, qd1, poll"
	if ! have qemu-img; then
		skip_row "$m1" "qemu-img not installed"; skip_row "$m2" "qemu-img not installed"; return
	fi
	if [ -d /dev/shm ] && shm_file=$(mktemp /dev/shm/compare-engine.XXXXXX) &&
		dd if=/dev/zero of="$shm_file" bs=1M count=64 status=none 2>/dev/null; then
		compare "$m1" "<=0.5" m4t_ioplane m4t_qemu
		rm -f "$shm_file"
	else
		skip_row "$m1" "cannot write a file in /dev/shm"
	fi
	compare "$m2" "abs<=35" m4n_ioplane m4n_qemu
}

if [ ! -x "$IOPLANE" ]; then
	echo "compare-engine.sh: $IOPLANE is not built (ninja -C build, or --ioplane PATH)" >&2
	exit 1
fi
note "ioplane: $IOPLANE ($("$IOPLANE" --version 2>/dev/null)); peer: $(qemu-img --version 2>/dev/null | head -n 1); $(fio --version 2>/dev/null)"
note "reps: $reps; $(nproc) CPUs; kernel $(uname -r)"

if [[ " $rows " == *" 2 "* || " $rows " == *" 3 "* ]]; then
	prepare_file
fi
for r in $rows; do
	case $r in
	1 | 2 | 3 | 4) "row$r" ;;
	*) echo "compare-engine.sh: no row $r" >&2; exit 2 ;;
	esac
done
print_table
note "total $((SECONDS - start_s)) s"
