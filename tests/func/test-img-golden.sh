#!/bin/bash
# Golden-output test of `ioplane img info|check|map`: runs every case of tests/golden/cases.sh
# on sparse copies of the fixed images in tests/golden/ and compares stdout, stderr for the
# golden_case_err cases, and the exit status with tests/golden/expected/NAME.out (recorded
# from qemu-img by make-images.sh, except the cases in KNOWN-DIFFERENCES). Also checks that
# the commands left the images untouched.
# GOLDEN_UPDATE=1 rewrites the expected output of the KNOWN-DIFFERENCES cases with ioplane's.
. "$(dirname "$0")/lib.sh"

GOLDEN=$IOPLANE_SRC/tests/golden
[ -f "$GOLDEN/cases.sh" ] || skip "no tests/golden/cases.sh"
. "$GOLDEN/cases.sh"
export TZ=UTC

need fallocate
cp "$GOLDEN"/*.qcow2 "$GOLDEN"/*.raw "$FUNC_TMP/"
cd "$FUNC_TMP"
golden_sparsify ./*.qcow2 ./*.raw 2>/dev/null ||
	skip "fallocate --dig-holes does not work on $(stat -f -c %T .): maps would differ"
sha256sum ./*.qcow2 ./*.raw >sums.before

known() {
	grep -qx "$1" <(sed -e 's/[[:space:]]*#.*//' -e '/^$/d' "$GOLDEN/KNOWN-DIFFERENCES")
}

failed=0
ncases=0
# golden_run NAME WITH_STDERR ARGS...: ioplane's output for the case in NAME.got.
golden_run() {
	local name=$1 with_err=$2 rc=0
	shift 2
	ncases=$((ncases + 1))
	{
		timeout 60 "$IOPLANE" img "$@" 2>"$name.err" || rc=$?
		if [ "$with_err" = 1 ]; then
			echo "[stderr]"
			cat "$name.err"
		fi
		echo "[exit $rc]"
	} | golden_normalise >"$name.got"
	if [ "${GOLDEN_UPDATE:-0}" = 1 ] && known "$name"; then
		cp "$name.got" "$GOLDEN/expected/$name.out"
	fi
	if ! diff -u "$GOLDEN/expected/$name.out" "$name.got" >"$name.diff"; then
		echo "--- case $name: ioplane img $* (stderr: $(head -c 300 "$name.err"))" >&2
		cat "$name.diff" >&2
		failed=$((failed + 1))
	fi
}
golden_case() { golden_run "$1" 0 "${@:2}"; }
golden_case_err() { golden_run "$1" 1 "${@:2}"; }

golden_cases
[ "$ncases" -gt 100 ] || fail "only $ncases cases ran"
sha256sum -c --quiet sums.before || fail "a read-only command changed an image"
[ $failed -eq 0 ] || fail "$failed of $ncases golden cases differ"
echo "all $ncases golden cases match"
