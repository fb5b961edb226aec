#!/bin/bash
# Golden-output test of `ioplane img info|check|map`: runs every case of tests/golden/cases.sh
# on copies of the fixed images in tests/golden/ and compares stdout and the exit status with
# tests/golden/expected/NAME.out (recorded from qemu-img by make-images.sh, except the cases
# in KNOWN-DIFFERENCES). Also checks that the commands left the images untouched.
# GOLDEN_UPDATE=1 rewrites the expected output of the KNOWN-DIFFERENCES cases with ioplane's.
. "$(dirname "$0")/lib.sh"

GOLDEN=$IOPLANE_SRC/tests/golden
[ -f "$GOLDEN/cases.sh" ] || skip "no tests/golden/cases.sh"
. "$GOLDEN/cases.sh"
export TZ=UTC

cp "$GOLDEN"/*.qcow2 "$GOLDEN"/*.raw "$FUNC_TMP/"
cd "$FUNC_TMP"
sha256sum ./*.qcow2 ./*.raw >sums.before

known() {
	grep -qx "$1" <(sed -e 's/[[:space:]]*#.*//' -e '/^$/d' "$GOLDEN/KNOWN-DIFFERENCES")
}

failed=0
ncases=0
golden_case() {
	local name=$1 rc=0
	shift
	ncases=$((ncases + 1))
	{
		timeout 60 "$IOPLANE" img "$@" 2>"$name.err" || rc=$?
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

golden_cases
[ "$ncases" -gt 100 ] || fail "only $ncases cases ran"
sha256sum -c --quiet sums.before || fail "a read-only command changed an image"
[ $failed -eq 0 ] || fail "$failed of $ncases golden cases differ"
echo "all $ncases golden cases match"
