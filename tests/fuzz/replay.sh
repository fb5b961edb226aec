#!/bin/bash
# Replays the fuzz corpora and crashers: every $IOPLANE_BUILD/tests/fuzz/replay-NAME runs
# on tests/fuzz/corpus-NAME/ and tests/fuzz/crashers-NAME/ (those that exist). Run by
# scripts/test.sh in every build (normal and ASan). Exit 0 when every replayer ran all its
# inputs cleanly, 1 otherwise, 77 when no replayer was built.
set -uo pipefail

src=${IOPLANE_SRC:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}
build=${IOPLANE_BUILD:-$src/build}
fuzzdir=$src/tests/fuzz
# Each replayer gets this long for all its inputs (a hang is a failure too).
limit=${REPLAY_TIMEOUT:-600}

found=0
failed=0
for bin in "$build"/tests/fuzz/replay-*; do
	[ -x "$bin" ] && [ -f "$bin" ] || continue
	name=${bin##*/replay-}
	dirs=()
	for d in "$fuzzdir/corpus-$name" "$fuzzdir/crashers-$name"; do
		[ -d "$d" ] && dirs+=("$d")
	done
	found=1
	if [ ${#dirs[@]} -eq 0 ]; then
		echo "replay-$name: no corpus-$name/ or crashers-$name/ (nothing to replay)"
		continue
	fi
	echo "replay-$name: ${dirs[*]}"
	rc=0
	timeout -k 10 "$limit" "$bin" "${dirs[@]}" 2>"$build/replay-$name.log" || rc=$?
	grep -v '^replay: ' "$build/replay-$name.log" || true
	if [ $rc -ne 0 ]; then
		echo "FAIL replay-$name: exit $rc; last input:"
		grep '^replay: ' "$build/replay-$name.log" | tail -n 1
		failed=1
	else
		echo "ok   replay-$name: $(grep -c '^replay: ' "$build/replay-$name.log") inputs"
	fi
done
[ $found = 1 ] || { echo "no replay-* binaries in $build/tests/fuzz"; exit 77; }
exit $failed
