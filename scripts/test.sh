#!/bin/bash
# The ioplane test command (CI runs exactly this, through .ci/run).
#
#   scripts/test.sh [--quick] [FILTER]
#
# Installs missing Debian packages (scripts/deps.sh test), builds build/
# (normal), build-asan/ (ASan+UBSan), build-clang/ (clang, compile only) and
# build-release/ (-O3, NDEBUG, compile only), then runs, for build/ and
# build-asan/: every unit test executable once per loop backend (io_uring,
# epoll), every tests/func/*.sh and *.py once, and tests/fuzz/replay.sh if
# present. A test passes with exit 0, is skipped with exit 77 (it prints
# why), and fails otherwise. Logs: build*/test-logs/.
# --quick: build/ only. FILTER: run only tests whose name contains it.
# Needs no stdin; run as root on a fresh Debian 12 to get the packages too.
set -uo pipefail

UNIT_TIMEOUT=300
FUNC_TIMEOUT=900
BACKENDS=(uring epoll)

usage() {
	sed -n '4,15s/^# \{0,1\}//p' "$0"
	exit "$1"
}

quick=0
filter=
for arg in "$@"; do
	case "$arg" in
	--quick) quick=1 ;;
	-h | --help) usage 0 ;;
	-*) echo "test.sh: unknown option $arg" >&2; usage 2 ;;
	*) [ -z "$filter" ] || usage 2; filter=$arg ;;
	esac
done

src=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$src" || exit 1
exec </dev/null

npass=0
nfail=0
nskip=0

now_us() {
	echo "${EPOCHREALTIME//[^0-9]/}" # the separator follows the locale
}

secs_since() {
	local us=$(($(now_us) - $1))
	printf '%d.%02ds' $((us / 1000000)) $((us % 1000000 / 10000))
}

matches() {
	[ -z "$filter" ] || [[ "$1" == *"$filter"* ]]
}

# report STATUS NAME TAG START LOG [NOTE]
report() {
	local status=$1 name=$2 tag=$3 start=$4 log=$5 note=${6:-}
	local line
	line="$status $name [$tag] $(secs_since "$start")"
	[ -n "$note" ] && line="$line ($note)"
	echo "$line"
	case "$status" in
	PASS) npass=$((npass + 1)) ;;
	SKIP) nskip=$((nskip + 1)) ;;
	FAIL)
		nfail=$((nfail + 1))
		if [ -s "$log" ]; then
			echo "---- last 40 lines of ${log#"$src"/}"
			tail -n 40 "$log" | sed 's/^/    /'
			echo "----"
		fi
		;;
	esac
}

# Last non-empty line of a log: what a skipping test said about why.
skip_reason() {
	grep -v '^[[:space:]]*$' "$1" 2>/dev/null | tail -n 1 | cut -c1-160
}

exit_note() {
	if [ "$1" -gt 128 ] && [ "$1" -lt 160 ]; then
		echo "killed by SIG$(kill -l $(($1 - 128)))"
	else
		echo "exit $1"
	fi
}

# run_one NAME TAG LOG TIMEOUT CMD...: run in $run_cwd, classify by exit
# code, report. timeout(1) signals the test's whole process group.
run_one() {
	local name=$1 tag=$2 log=$3 limit=$4
	shift 4
	local start rc
	start=$(now_us)
	# The outer 2>/dev/null silences bash's own "Aborted" job notice.
	{ (cd "$run_cwd" && exec timeout -k 10 "$limit" "$@") >"$log" 2>&1 </dev/null; } 2>/dev/null
	rc=$?
	# 137 is timeout's SIGKILL (-k) for a test that ignored SIGTERM, or any
	# other SIGKILL; only the elapsed time tells them apart.
	if [ $rc -eq 137 ] && [ $(($(now_us) - start)) -ge $((limit * 1000000)) ]; then
		rc=124
	fi
	case $rc in
	0) report PASS "$name" "$tag" "$start" "$log" ;;
	77) report SKIP "$name" "$tag" "$start" "$log" "$(skip_reason "$log")" ;;
	124) report FAIL "$name" "$tag" "$start" "$log" "timeout after ${limit}s" ;;
	*) report FAIL "$name" "$tag" "$start" "$log" "$(exit_note $rc)" ;;
	esac
}

# configure DIR [MESON ARGS...]: set up or reconfigure a build directory.
# Options are always passed in full because --reconfigure keeps old ones.
# A directory set up with another compiler than $CC is wiped: reconfiguring
# cannot change the compiler.
configure() {
	local dir=$1
	shift
	if [ ! -f "$dir/meson-private/coredata.dat" ]; then
		meson setup "$dir" "$@"
		return
	fi
	if [ -n "${CC:-}" ] && ! grep -A1 '^rule c_COMPILER$' "$dir/build.ninja" 2>/dev/null |
		grep -qE "command = (ccache )?$CC "; then
		meson setup --wipe "$dir" "$@"
		return
	fi
	meson setup --reconfigure "$dir" "$@" || meson setup --wipe "$dir" "$@"
}

# build NAME DIR [MESON ARGS...]: configure and compile as one reported step.
# Returns non-zero if the build failed. The log lands in DIR/test-logs/.
build() {
	local name=$1 dir=$2
	shift 2
	local start tmp rc
	start=$(now_us)
	tmp=$(mktemp)
	# -k 0: build all that can be built, so that one broken file does not
	# hide the results of every test that does not depend on it.
	{ configure "$dir" "$@" && ninja -k 0 -C "$dir"; } >"$tmp" 2>&1 </dev/null
	rc=$?
	# A --wipe may have removed test-logs/, so the log is moved in afterwards.
	mkdir -p "$dir/test-logs"
	mv -f "$tmp" "$dir/test-logs/build.log"
	if [ $rc -eq 0 ]; then
		report PASS "$name" "$dir" "$start" "$dir/test-logs/build.log"
	else
		report FAIL "$name" "$dir" "$start" "$dir/test-logs/build.log" "exit $rc"
	fi
	return $rc
}

# fresh DIR TARGET: true if TARGET is up to date (after a failed build, an
# executable left over from an earlier build is stale and must not run).
fresh() {
	[ "$build_ok" -eq 1 ] && return 0
	[ -e "$1/$2" ] || return 1
	ninja -C "$1" -n "$2" 2>/dev/null | grep -q 'no work to do'
}

# not_built NAME TAG: account for a test whose executable did not build.
not_built() {
	report SKIP "$1" "$2" "$(now_us)" /dev/null "not built: the build failed"
}

unit_tests() {
	local dir=$1 f
	for f in "$dir"/tests/unit/test-*; do
		[ -f "$f" ] && [ -x "$f" ] && echo "$f"
	done
}

# Helper files that tests source or import are not tests: *-lib.sh,
# *-lib.py, lib*, _* (e.g. tests/func/nbd-lib.sh).
func_tests() {
	local f
	for f in tests/func/*.sh tests/func/*.py; do
		[ -f "$f" ] || continue
		case "${f##*/}" in
		*-lib.sh | *-lib.py | lib* | _*) continue ;;
		esac
		echo "$f"
	done
}

# run_build DIR OK: every test against one build directory; OK=0 after a
# failed build, when only up-to-date executables run.
run_build() {
	local dir=$1 abs="$src/$1" t name b interp build_ok=$2 ioplane_ok=1
	local logs="$abs/test-logs"
	local -a env=(IOPLANE="$abs/ioplane" IOPLANE_BUILD="$abs" IOPLANE_SRC="$src")

	if [ "$dir" = build-asan ]; then
		env+=(ASAN_OPTIONS=detect_leaks=1:abort_on_error=1
			UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1)
	fi
	mkdir -p "$logs"
	run_cwd=$abs
	for t in $(unit_tests "$abs"); do
		name=$(basename "$t")
		matches "$name" || continue
		if ! fresh "$abs" "tests/unit/$name"; then
			not_built "$name" "$dir"
			continue
		fi
		for b in "${BACKENDS[@]}"; do
			run_one "$name" "$dir $b" "$logs/$name-$b.log" $UNIT_TIMEOUT \
				env "${env[@]}" IOPLANE_LOOP_BACKEND="$b" "$t"
		done
	done
	fresh "$abs" ioplane || ioplane_ok=0
	for t in $(func_tests); do
		name=${t#tests/}
		matches "$name" || continue
		if [ $ioplane_ok -eq 0 ]; then
			not_built "$name" "$dir"
			continue
		fi
		case "$t" in
		*.py) interp=python3 ;;
		*) interp=bash ;;
		esac
		run_one "$name" "$dir" "$logs/${name//\//-}.log" $FUNC_TIMEOUT \
			env "${env[@]}" $interp "$src/$t"
	done
	if [ -f tests/fuzz/replay.sh ] && matches fuzz/replay.sh; then
		# Fuzz targets are built by the same ninja run; replay.sh checks
		# for the ones it needs.
		run_one fuzz/replay.sh "$dir" "$logs/fuzz-replay.log" $FUNC_TIMEOUT \
			env "${env[@]}" bash "$src/tests/fuzz/replay.sh"
	fi
}

if ! bash scripts/deps.sh test; then
	echo "test.sh: scripts/deps.sh failed; carrying on with what is installed" >&2
fi

# The tests start python3 thousands of times. Debian's interpreter, the one
# whose packages deps.sh installs, comes first on PATH: a version manager's
# shim found earlier (pyenv's runs a shell script and several processes per
# start) would cost more than some tests' own work.
if [ -x /usr/bin/python3 ] && [ "$(command -v python3)" != /usr/bin/python3 ]; then
	pybin=$(mktemp -d /tmp/ioplane-test-bin.XXXXXX)
	ln -s /usr/bin/python3 "$pybin/python3"
	trap 'rm -rf "$pybin"' EXIT
	export PATH="$pybin:$PATH"
fi

ok=1
build build build -Db_sanitize=none -Db_lundef=true || ok=0
run_build build $ok
if [ $quick -eq 0 ]; then
	ok=1
	build build-asan build-asan -Db_sanitize=address,undefined -Db_lundef=false || ok=0
	run_build build-asan $ok
	if matches clang-build; then
		if command -v clang >/dev/null; then
			CC=clang build clang-build build-clang \
				-Db_sanitize=none -Db_lundef=true
		else
			report SKIP clang-build build-clang "$(now_us)" /dev/null \
				"clang not installed"
		fi
	fi
	# What a packager builds: -O3 finds other maybe-uninitialized paths,
	# and NDEBUG drops the asserts (and anything they would have used).
	if matches release-build; then
		build release-build build-release --buildtype=release -Db_ndebug=true \
			-Db_sanitize=none -Db_lundef=true
	fi
fi

echo "$npass passed, $nfail failed, $nskip skipped"
[ $nfail -eq 0 ]
