#!/bin/bash
# The qcow2 driver side by side with qemu-img, in one invocation. Each figure is the median
# of --runs runs (default 3) that alternate between the two sides (the order flips every
# run). Prints one table row per metric: a, b, a/b, target, ok / NOT MET ("ref": shown for
# reference, no target). a/b is the median of the ratios of the runs made back to back,
# which is steadier on a machine whose speed drifts than the ratio of the medians.
#
#   1  first write into every cluster of a fresh 8 GiB qcow2 image: 75,000 4 KiB writes,
#      one per 64 KiB (-S 65536), depth 64, O_DIRECT; wall time of the whole command
#      (open, run, flush, close); a fresh image per run, made by the tool's own `create`:
#      `ioplane bench -f qcow2 -t none -w -S 65536` vs `qemu-img bench -f qcow2 -t none -n
#      -w -S 65536`, with 64 KiB and with 2 MiB clusters, on --dir (ext4) and on XFS (a
#      loop device over a sparse file in --dir, or --xfs-dir). Reference rows: the same
#      bench on a fresh sparse raw file (the device's first-write floor), and ioplane's
#      2 MiB time against that floor (the faster of the two tools' raw runs).
#   2  steady state: 4 KiB random reads and writes at depth 64, O_DIRECT, io_uring, on a
#      fully written 1 GiB qcow2 image vs a fully written 1 GiB raw file in --dir:
#      `ioplane bench --random` IOPS, qcow2/raw. Reference: qemu-img bench's qcow2/raw
#      ratio (sequential: qemu-img bench has no random offsets).
#   3  instructions per 4 KiB read (depth 64) of an allocated qcow2 image whose external
#      data file is replaced by the null driver at open: the marginal Ir under
#      `valgrind --tool=callgrind` between -c 20000 and -c 120000 (start-up cancels out);
#      `ioplane bench --image-opts ...,format=qcow2,data-file=null:size=1G` vs `qemu-img
#      bench --image-opts driver=qcow2,...,data-file.driver=null-co,data-file.size=1G`.
#   4  instructions per 4 KiB write (depth 64) into an allocated qcow2 image whose data
#      lives in the image file (preallocation=metadata), on tmpfs (/dev/shm): the same
#      marginal Ir; every write checks its cluster against all metadata on the fast path
#      (QEMU's overlap-check=cached): `ioplane bench -w -f qcow2` vs `qemu-img bench -w`.
#
#   bench/compare-qcow2.sh [--ioplane PATH] [--runs N] [--rows "1 2 3 4"] [--dir DIR]
#                          [--xfs-dir DIR | --no-xfs] [--quick]
#
# A benchmark, not a test: it installs nothing (mkfs.xfs comes with scripts/deps.sh test),
# skips a row (saying why) when a tool or root (for the loop device) is missing, exits 0
# whether targets are met or not, 2 on bad usage. Every command runs under timeout; no
# metric starts after 17 minutes and none runs past 19.5. Everything it creates (images,
# the loop device, its mount and backing file) is removed on exit.
set -uo pipefail

src=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
IOPLANE=${IOPLANE:-$src/build/ioplane}
runs=3
dir=/var/tmp
xfs_dir=
use_xfs=1
rows="1 2 3 4"
quick=0
budget=1020     # no new metric starts after this many seconds
hard_limit=1170 # and no command runs past this
cmd_timeout=300

usage() {
	sed -n '25,26s/^# \{0,1\}//p' "$0"
	exit "$1"
}

while [ $# -gt 0 ]; do
	case "$1" in
	--ioplane) IOPLANE=${2:-}; shift ;;
	--runs | --reps) runs=${2:-}; shift ;;
	--rows) rows=${2:-}; shift ;;
	--dir) dir=${2:-}; shift ;;
	--xfs-dir) xfs_dir=${2:-}; shift ;;
	--no-xfs) use_xfs=0 ;;
	--quick) quick=1 ;;
	-h | --help) usage 0 ;;
	*) echo "compare-qcow2.sh: unknown argument '$1'" >&2; usage 2 ;;
	esac
	shift || usage 2
done
[[ "$runs" =~ ^[1-9][0-9]*$ ]] || usage 2
for r in $rows; do
	case $r in 1 | 2 | 3 | 4) ;; *) echo "compare-qcow2.sh: no row $r" >&2; exit 2 ;; esac
done

fw_count=75000 # requests per run of row 1
fw_size=8G
ss_ios=200000
cg_lo=20000 cg_hi=120000
if [ $quick -eq 1 ]; then
	runs=1 fw_count=20000 ss_ios=50000
fi

start_s=$SECONDS
tmp=$(mktemp -d /tmp/compare-qcow2.XXXXXX)
made=()    # files to delete on exit
xfs_loop=  # loop device we set up
xfs_mnt=   # and where we mounted it
child=     # the command `run` waits for
cleanup() {
	local f
	if [ -n "$child" ]; then # interrupted: stop it before its files go
		kill -TERM "$child" 2>/dev/null
		wait "$child" 2>/dev/null
	fi
	if [ -n "$xfs_mnt" ]; then
		rm -f "$xfs_mnt"/compare-qcow2.* 2>/dev/null
		umount "$xfs_mnt" 2>/dev/null || umount -l "$xfs_mnt" 2>/dev/null
		rmdir "$xfs_mnt" 2>/dev/null
	fi
	[ -n "$xfs_loop" ] && losetup -d "$xfs_loop" 2>/dev/null
	for f in "${made[@]}"; do rm -f "$f"; done
	rm -f "$dir"/compare-qcow2.$$.*
	rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

have() { command -v "$1" >/dev/null 2>&1; }
note() { echo "# $*" >&2; }

# ---- table ----

results=()

# row METRIC A B TARGET [RATIO]: TARGET is "<=X" or ">=X" on RATIO (default A/B), or "ref"
# (no target).
row() {
	results+=("$(awk -v m="$1" -v a="$2" -v p="$3" -v t="$4" -v q="${5:-}" 'BEGIN {
		op = substr(t, 1, 2); lim = substr(t, 3) + 0
		if (q != "") { v = q + 0; r = sprintf("%.3f", v) }
		else if (p + 0 == 0) { r = "-"; v = "" } else { v = a / p; r = sprintf("%.3f", v) }
		if (t == "ref") res = "reference"
		else if (v == "") res = "NOT MET (no ratio)"
		else res = ((op == "<=") ? (v <= lim) : (v >= lim)) ? "ok" : "NOT MET"
		printf "%-46s %11s %11s %7s %7s  %s", m, a, p, r, t, res
	}')")
}

skip_row() {
	results+=("$(printf '%-46s %11s %11s %7s %7s  %s' "$1" - - - - "skipped: $2")")
}

print_table() {
	echo
	printf '%-46s %11s %11s %7s %7s  %s\n' "metric (a vs b)" a b a/b target result
	printf '%s\n' "${results[@]}"
}

# ---- helpers ----

median() {
	printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 } END {
		if (NR == 0) exit 1
		if (NR % 2) print v[(NR + 1) / 2]; else printf "%.6g\n", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}

min2() { awk -v a="$1" -v b="$2" 'BEGIN { print (a + 0 < b + 0) ? a : b }'; }

over_budget() { [ $((SECONDS - start_s)) -ge $budget ]; }

# run LOG CMD...: under timeout, output to LOG; fails on error or timeout. No command
# outlives the run's deadline. Started in the background and waited for, so that ^C or
# SIGTERM runs the trap at once (the cleanup stops the command); for the same reason
# nothing calls run from inside $(...).
run() {
	local log=$1 limit=$cmd_timeout left rc=0
	shift
	left=$((start_s + hard_limit - SECONDS))
	[ $left -lt $limit ] && limit=$left
	if [ $limit -le 1 ]; then
		echo "time budget spent" >"$log"
		return 1
	fi
	timeout -k 5 $limit "$@" >"$log" 2>&1 &
	child=$!
	wait "$child" || rc=$?
	child=
	return $rc
}

# alternate N FA FB: run the two shell functions in alternating order, N times each; their
# outputs (one number per run) land in $tmp/FA.vals and $tmp/FB.vals. They run in this
# shell (not in $(...)), see run.
alternate() {
	local n=$1 fa=$2 fb=$3 i v f
	: >"$tmp/$fa.vals"
	: >"$tmp/$fb.vals"
	for ((i = 0; i < n; i++)); do
		for f in $([ $((i % 2)) -eq 0 ] && echo "$fa $fb" || echo "$fb $fa"); do
			"$f" >"$tmp/one.val" ||
				{ note "$f failed: $(tail -n 3 "$tmp/last.log" 2>/dev/null)"; return 1; }
			v=$(head -n 1 "$tmp/one.val")
			[ -n "$v" ] || { note "$f printed no result"; return 1; }
			note "  $f: $v"
			echo "$v" >>"$tmp/$f.vals"
		done
	done
}

vals() { local v; mapfile -t v <"$tmp/$1.vals"; median "${v[@]}"; }

# pair_ratio FA FB: the median of FA/FB over the pairs of runs made back to back, which
# drift of the machine between pairs does not move (the a and b columns are medians of
# their own).
pair_ratio() {
	local r
	mapfile -t r < <(paste "$tmp/$1.vals" "$tmp/$2.vals" | awk '$2 > 0 { print $1 / $2 }')
	median "${r[@]}"
}

# compare METRIC TARGET FA FB: alternate FA and FB, add the row.
compare() {
	local metric=$1 target=$2 a=$3 b=$4
	if over_budget; then
		skip_row "$metric" "time budget spent"
		return 1
	fi
	note "measuring: $metric"
	if alternate "$runs" "$a" "$b"; then
		row "$metric" "$(vals "$a")" "$(vals "$b")" "$target" "$(pair_ratio "$a" "$b")"
	else
		skip_row "$metric" "a run failed (see above)"
		return 1
	fi
}

bench_secs() { awk '/^Run completed in/ { print $4 }' "$1"; }
is_asan() { ldd "$1" 2>/dev/null | grep -q libasan; }
fs_type() { findmnt -n -o FSTYPE --target "$1" 2>/dev/null || stat -f -c %T "$1"; }

# ---- row 1: first write into fresh images ----

# fw TOOL KIND DIR: one run on a fresh image (KIND 64K, 2M or raw) in DIR; prints the
# command's wall time in seconds. The image is made before and deleted after the clock.
fw() {
	local tool=$1 kind=$2 d=$3 img log=$tmp/last.log t0 t1 secs
	local create=() bench=()
	img=$d/compare-qcow2.$$.$tool.$kind
	rm -f "$img"
	case $tool/$kind in
	ioplane/raw) create=("$IOPLANE" img create -q -f raw "$img" "$fw_size")
		bench=("$IOPLANE" bench -f raw -t none -w -S 65536 -c "$fw_count" "$img") ;;
	qemu/raw) create=(qemu-img create -q -f raw "$img" "$fw_size")
		bench=(qemu-img bench -f raw -t none -n -w -S 65536 -c "$fw_count" "$img") ;;
	ioplane/*) create=("$IOPLANE" img create -q -f qcow2 -o "cluster_size=$kind" "$img" "$fw_size")
		bench=("$IOPLANE" bench -f qcow2 -t none -w -S 65536 -c "$fw_count" "$img") ;;
	qemu/*) create=(qemu-img create -q -f qcow2 -o "cluster_size=$kind" "$img" "$fw_size")
		bench=(qemu-img bench -f qcow2 -t none -n -w -S 65536 -c "$fw_count" "$img") ;;
	esac
	run "$log" "${create[@]}" || return 1
	sync -f "$d"
	t0=$EPOCHREALTIME
	run "$log" "${bench[@]}" || { rm -f "$img"; return 1; }
	t1=$EPOCHREALTIME
	secs=$(bench_secs "$log")
	rm -f "$img"
	# Deleting gigabytes may queue discards (ext4 -o discard): let them finish now.
	sync -f "$d"
	awk -v a="$t0" -v b="$t1" -v s="$secs" -v w="$tool $kind $d" 'BEGIN {
		printf "# %s: %.3f s wall (bench: %s s)\n", w, b - a, s > "/dev/stderr"
		printf "%.3f\n", b - a }'
}

fw_ext_64_io() { fw ioplane 64K "$dir"; }
fw_ext_64_qe() { fw qemu 64K "$dir"; }
fw_ext_2m_io() { fw ioplane 2M "$dir"; }
fw_ext_2m_qe() { fw qemu 2M "$dir"; }
fw_ext_raw_io() { fw ioplane raw "$dir"; }
fw_ext_raw_qe() { fw qemu raw "$dir"; }
fw_xfs_64_io() { fw ioplane 64K "$xfs_dir"; }
fw_xfs_64_qe() { fw qemu 64K "$xfs_dir"; }
fw_xfs_2m_io() { fw ioplane 2M "$xfs_dir"; }
fw_xfs_2m_qe() { fw qemu 2M "$xfs_dir"; }
fw_xfs_raw_io() { fw ioplane raw "$xfs_dir"; }
fw_xfs_raw_qe() { fw qemu raw "$xfs_dir"; }

# fw_rows TAG LABEL: the four rows of one file system.
fw_rows() {
	local t=$1 l=$2
	compare "first write 64K cl, $l: wall s ioplane/qemu" "<=0.8" "fw_${t}_64_io" "fw_${t}_64_qe"
	compare "first write 2M cl, $l: wall s ioplane/qemu" "<=0.8" "fw_${t}_2m_io" "fw_${t}_2m_qe"
	if compare "  raw-file floor, $l: wall s ioplane/qemu" ref "fw_${t}_raw_io" \
		"fw_${t}_raw_qe" && [ -s "$tmp/fw_${t}_2m_io.vals" ]; then
		# The floor is the faster of the two (their raw files differ: qemu-img create
		# gives new files an XFS extent size hint).
		row "  2M cl vs raw floor, $l: ioplane qcow2/floor" "$(vals "fw_${t}_2m_io")" \
			"$(min2 "$(vals "fw_${t}_raw_io")" "$(vals "fw_${t}_raw_qe")")" ref
	fi
}

# Sets xfs_dir, or xfs_err to why there is none. Not in a subshell: it sets globals.
xfs_err=
xfs_setup() {
	local backing
	if [ -n "$xfs_dir" ]; then
		[ "$(fs_type "$xfs_dir")" = xfs ] || xfs_err="--xfs-dir $xfs_dir is not on XFS"
		return
	fi
	if [ $use_xfs -eq 0 ]; then xfs_err="--no-xfs"; return; fi
	if [ "$(id -u)" -ne 0 ]; then xfs_err="not root (loop device); pass --xfs-dir"; return; fi
	if ! have mkfs.xfs; then xfs_err="mkfs.xfs missing (scripts/deps.sh test)"; return; fi
	if ! have losetup; then xfs_err="losetup missing"; return; fi
	if ! backing=$(mktemp "$dir/compare-qcow2.XXXXXX.xfs"); then
		xfs_err="cannot create a file in $dir"; return
	fi
	made+=("$backing")
	# Sparse, so it takes only what the runs write; room for two 8 GiB images.
	truncate -s 20G "$backing"
	if ! xfs_loop=$(losetup --find --show --direct-io=on "$backing" 2>"$tmp/losetup.log"); then
		xfs_loop=
		xfs_err="losetup failed: $(head -n 1 "$tmp/losetup.log")"; return
	fi
	if ! mkfs.xfs -q -f "$xfs_loop" >"$tmp/mkfs.log" 2>&1; then
		xfs_err="mkfs.xfs failed: $(head -n 1 "$tmp/mkfs.log")"; return
	fi
	xfs_mnt=$(mktemp -d /tmp/compare-qcow2-xfs.XXXXXX) || { xfs_err="mktemp"; return; }
	if ! mount -t xfs "$xfs_loop" "$xfs_mnt" 2>"$tmp/mount.log"; then
		rmdir "$xfs_mnt"; xfs_mnt=
		xfs_err="mount failed: $(head -n 1 "$tmp/mount.log")"; return
	fi
	xfs_dir=$xfs_mnt
	note "XFS on $xfs_loop (sparse $backing, direct I/O) at $xfs_dir"
}

row1() {
	local ext l r
	if ! have qemu-img; then
		for l in ext4 xfs; do skip_row "first write, $l" "qemu-img not installed"; done
		return
	fi
	ext=$(fs_type "$dir")
	if [ "$ext" = tmpfs ]; then
		skip_row "first write, $dir" "$dir is tmpfs (no O_DIRECT); pass --dir"
	else
		[ "$ext" = ext4 ] || note "--dir $dir is $ext, not ext4: its rows say so"
		fw_rows ext "$ext"
	fi
	xfs_setup
	if [ -n "$xfs_err" ]; then
		for r in "first write 64K cl" "first write 2M cl" "  raw-file floor"; do
			skip_row "$r, xfs" "$xfs_err"
		done
	else
		fw_rows xfs xfs
	fi
}

# ---- row 2: steady state on fully written images ----

ss_raw=
ss_qcow2=
ss_err="not prepared"
ss_fill() {
	local log=$tmp/prep.log
	run "$log" "$IOPLANE" img create -q -f "$1" "$2" 1G &&
		run "$log" "$IOPLANE" bench -q -f "$1" -t none -w -s 1M -d 8 -c 1023 \
			--pattern=0x5a "$2" &&
		run "$log" "$IOPLANE" bench -q -f "$1" -t none -w -s 1M -o 1023M -c 1 \
			--pattern=0x5a "$2"
}

ss_prepare() {
	local log=$tmp/prep.log
	ss_err=
	if [ "$(fs_type "$dir")" = tmpfs ]; then
		ss_err="$dir is tmpfs (no O_DIRECT); pass --dir"; return
	fi
	ss_raw=$dir/compare-qcow2.$$.ss.raw
	ss_qcow2=$dir/compare-qcow2.$$.ss.qcow2
	made+=("$ss_raw" "$ss_qcow2")
	note "writing a 1 GiB raw file and a 1 GiB qcow2 image in $dir"
	# Both written through ioplane with the same data (not sparse, not zeroes: reads must
	# reach the disk and nothing below may treat zeroes specially); preallocation=metadata
	# would leave the qcow2 data unwritten. bench wraps before the last buffer: that one is
	# written apart.
	if ! ss_fill raw "$ss_raw" || ! ss_fill qcow2 "$ss_qcow2"; then
		ss_err="cannot write the images: $(head -n 1 "$log")"; return
	fi
	if have qemu-img && qemu-img map -f qcow2 --output=json "$ss_qcow2" 2>/dev/null |
		grep -q '"data": false'; then
		ss_err="$ss_qcow2 is not fully allocated"
	fi
}

ss_ioplane() {
	local log=$tmp/last.log
	run "$log" "$IOPLANE" bench -d 64 -c $ss_ios -t none -i io_uring --random "$@" || return 1
	awk '/^IOPS:/ { sub(",", "", $2); print $2 }' "$log"
}
ss_qemu() {
	local log=$tmp/last.log s
	run "$log" qemu-img bench -d 64 -c $ss_ios -t none -i io_uring "$@" || return 1
	s=$(bench_secs "$log")
	awk -v s="$s" -v n=$ss_ios 'BEGIN { if (s > 0) printf "%.0f\n", n / s }'
}
ss_rd_q() { ss_ioplane -f qcow2 "$ss_qcow2"; }
ss_rd_r() { ss_ioplane -f raw "$ss_raw"; }
ss_wr_q() { ss_ioplane -w -f qcow2 "$ss_qcow2"; }
ss_wr_r() { ss_ioplane -w -f raw "$ss_raw"; }
ss_qrd_q() { ss_qemu -f qcow2 "$ss_qcow2"; }
ss_qrd_r() { ss_qemu -f raw "$ss_raw"; }
ss_qwr_q() { ss_qemu -w -f qcow2 "$ss_qcow2"; }
ss_qwr_r() { ss_qemu -w -f raw "$ss_raw"; }

row2() {
	local m
	local m1="4k randread qd64 IOPS: ioplane qcow2/raw" m2="4k randwrite qd64 IOPS: ioplane qcow2/raw"
	local m3="  4k seq read qd64 IOPS: qemu-img qcow2/raw" m4="  4k seq write qd64 IOPS: qemu-img qcow2/raw"
	ss_prepare
	if [ -n "$ss_err" ]; then
		for m in "$m1" "$m2"; do skip_row "$m" "$ss_err"; done
		return
	fi
	compare "$m1" ">=0.95" ss_rd_q ss_rd_r
	compare "$m2" ">=0.95" ss_wr_q ss_wr_r
	if have qemu-img; then
		compare "$m3" ref ss_qrd_q ss_qrd_r
		compare "$m4" ref ss_qwr_q ss_qwr_r
	fi
	rm -f "$ss_raw" "$ss_qcow2"
}

# ---- row 3: instructions per read, qcow2 over a null data file ----

# callgrind_ir CMD...: sets cg_ir to the instructions CMD executed.
callgrind_ir() {
	local log=$tmp/last.log
	run "$log" valgrind --tool=callgrind --callgrind-out-file=/dev/null "$@" || return 1
	cg_ir=$(awk '/Collected :/ { print $NF }' "$log")
	[ -n "$cg_ir" ]
}

# Marginal instructions per request between cg_lo and cg_hi requests.
cg_per_req() {
	local tool=$1 lo
	shift
	callgrind_ir "$tool" bench -c $cg_lo "$@" || return 1
	lo=$cg_ir
	callgrind_ir "$tool" bench -c $cg_hi "$@" || return 1
	awk -v a="$lo" -v b="$cg_ir" -v n=$((cg_hi - cg_lo)) 'BEGIN { printf "%.1f\n", (b - a) / n }'
}
cg_img=$tmp/nulldata.qcow2
cg_ioplane() {
	cg_per_req "$IOPLANE" -q -d 64 --image-opts \
		"driver=file,filename=$cg_img,format=qcow2,data-file=null:size=1G"
}
cg_qemu() {
	cg_per_req qemu-img -d 64 --image-opts \
		"driver=qcow2,file.filename=$cg_img,data-file.driver=null-co,data-file.size=1G"
}

row3() {
	local m="instr/4k read qd64, qcow2 on null data file" log=$tmp/prep.log
	if ! have valgrind; then skip_row "$m" "valgrind not installed"; return; fi
	if ! have qemu-img; then skip_row "$m" "qemu-img not installed"; return; fi
	if is_asan "$IOPLANE"; then skip_row "$m" "ioplane is a sanitizer build"; return; fi
	# Every cluster allocated (metadata preallocation: L2 entries point into the data
	# file); the metadata is small and cached, the data file is never opened.
	if ! run "$log" qemu-img create -q -f qcow2 -o \
		"data_file=$tmp/nulldata.raw,data_file_raw=on,preallocation=metadata" "$cg_img" 1G; then
		skip_row "$m" "qemu-img create failed: $(head -n 1 "$log")"; return
	fi
	compare "$m" "<=0.25" cg_ioplane cg_qemu
}

# ---- row 4: instructions per write, data in the image file ----

cg_wimg=
cg_w_ioplane() { cg_per_req "$IOPLANE" -q -w -d 64 -f qcow2 "$cg_wimg"; }
cg_w_qemu() { cg_per_req qemu-img -w -d 64 -f qcow2 "$cg_wimg"; }

row4() {
	local m="instr/4k write qd64, qcow2 on tmpfs" log=$tmp/prep.log
	if ! have valgrind; then skip_row "$m" "valgrind not installed"; return; fi
	if ! have qemu-img; then skip_row "$m" "qemu-img not installed"; return; fi
	if is_asan "$IOPLANE"; then skip_row "$m" "ioplane is a sanitizer build"; return; fi
	if [ "$(stat -f -c %T /dev/shm 2>/dev/null)" != tmpfs ]; then
		skip_row "$m" "no tmpfs at /dev/shm"; return
	fi
	# Every cluster allocated in the image file; the writes overwrite them in the page
	# cache (fast path), so the figure is the qcow2 work plus the engine's.
	cg_wimg=/dev/shm/compare-qcow2.$$.qcow2
	made+=("$cg_wimg")
	if ! run "$log" qemu-img create -q -f qcow2 -o preallocation=metadata "$cg_wimg" 1G; then
		skip_row "$m" "qemu-img create failed: $(head -n 1 "$log")"; return
	fi
	compare "$m" "ref" cg_w_ioplane cg_w_qemu
	rm -f "$cg_wimg"
}

# ---- main ----

if [ ! -x "$IOPLANE" ]; then
	echo "compare-qcow2.sh: $IOPLANE is not built (ninja -C build, or --ioplane PATH)" >&2
	exit 1
fi
note "ioplane: $IOPLANE ($("$IOPLANE" --version 2>/dev/null)); peer: $(qemu-img --version 2>/dev/null | head -n 1)"
note "runs: $runs; $(nproc) CPUs; kernel $(uname -r); --dir $dir ($(fs_type "$dir"))"
for r in $rows; do "row$r"; done
print_table
note "total $((SECONDS - start_s)) s"
