#!/bin/bash
# The USDT probes docs/tracing.md lists are in the executable: every probe named in
# its table appears as an stapsdt note (provider ioplane) in `readelf -n`, and every
# probe in the executable is in the table.
. "$(dirname "$0")/lib.sh"

need readelf
doc=$IOPLANE_SRC/docs/tracing.md
[ -f "$doc" ] || fail "no $doc"

documented=$(sed -n 's/^| `\([a-z0-9_]*\)` |.*/\1/p' "$doc" | sort -u)
[ -n "$documented" ] || fail "no probe table in $doc"
notes=$(readelf -n "$IOPLANE")
built=$(awk '/Provider: ioplane/ { p = 1; next } p && /Name:/ { print $2; p = 0 }' \
	<<<"$notes" | sort -u)
[ -n "$built" ] || fail "no ioplane USDT probe in $IOPLANE (built with -Dusdt=false?)"

missing=$(comm -23 <(echo "$documented") <(echo "$built"))
[ -z "$missing" ] || fail "documented but not in the executable: $missing"
undocumented=$(comm -13 <(echo "$documented") <(echo "$built"))
[ -z "$undocumented" ] || fail "in the executable but not in docs/tracing.md: $undocumented"
echo "ok: $(wc -l <<<"$documented") probes documented and compiled in"
