#!/bin/bash
# `meson install` puts the binary, the man page and the systemd units (ioplane.service
# with ExecStart naming the installed binary, ioplane.socket) under the prefix, and
# `systemd-analyze verify` passes on the installed units (the Documentation= man page
# found through MANPATH in the installed tree). The service's ExecStart command line
# is one `ioplane serve` accepts: it serves the socket unit's paths when run with them
# moved into a scratch directory.
. "$(dirname "$0")/lib.sh"

need meson systemd-analyze man nbdinfo
[ -f "$IOPLANE_BUILD/build.ninja" ] || skip "no configured build directory"

dest=$FUNC_TMP/dest
timeout 600 meson install -C "$IOPLANE_BUILD" --no-rebuild --quiet --destdir "$dest" \
	>"$FUNC_TMP/install.log" 2>&1 || { cat "$FUNC_TMP/install.log"; fail "meson install failed"; }
prefix=$(meson introspect --buildoptions "$IOPLANE_BUILD" |
	python3 -c 'import json,sys; print([o["value"] for o in json.load(sys.stdin) if o["name"] == "prefix"][0])')
root=$dest$prefix
units=$root/lib/systemd/system
for f in "$root/bin/ioplane" "$root/share/man/man1/ioplane.1" "$units/ioplane.service" \
	"$units/ioplane.socket"; do
	[ -f "$f" ] || fail "meson install did not install $f"
done
grep -q "^ExecStart=$prefix/bin/ioplane serve " "$units/ioplane.service" ||
	fail "ExecStart does not name the installed binary: $(grep ExecStart "$units/ioplane.service")"

# verify checks that ExecStart's binary exists: point it at the one installed here.
mkdir "$FUNC_TMP/units"
sed "s|^ExecStart=$prefix/bin/ioplane|ExecStart=$root/bin/ioplane|" "$units/ioplane.service" \
	>"$FUNC_TMP/units/ioplane.service"
cp "$units/ioplane.socket" "$FUNC_TMP/units/"
out=$(cd "$FUNC_TMP/units" && MANPATH=$root/share/man timeout 120 \
	systemd-analyze verify ./ioplane.socket ./ioplane.service 2>&1)
rc=$?
if [ $rc -ne 0 ] && grep -qiE "Failed to (initialize|connect|create)|No such file or directory.*(bus|cgroup)" <<<"$out"; then
	skip "systemd-analyze verify cannot run here: $(head -1 <<<"$out")"
fi
[ $rc -eq 0 ] && [ -z "$out" ] || fail "systemd-analyze verify ($rc): $out"

# The ExecStart line, with IOPLANE_EXPORTS expanded and /run/ioplane, /var/lib/ioplane
# moved here, serves the socket unit's NBD path.
exports=$(sed -n 's/^Environment="IOPLANE_EXPORTS=\(.*\)"$/\1/p' "$units/ioplane.service")
cmd=$(sed -n 's/^ExecStart=//p' "$units/ioplane.service")
cmd=${cmd//\$IOPLANE_EXPORTS/$exports}
cmd=${cmd//\/run\/ioplane/$FUNC_TMP/run}
cmd=${cmd//\/var\/lib\/ioplane/$FUNC_TMP/lib}
cmd=${cmd/#$prefix\/bin\/ioplane/$IOPLANE}
mkdir "$FUNC_TMP/run" "$FUNC_TMP/lib"
truncate -s 8M "$FUNC_TMP/lib/disk.img"
nbd=$(sed -n 's|^ListenStream=/run/ioplane/\(.*nbd.*\)$|\1|p' "$units/ioplane.socket")
[ -n "$nbd" ] || fail "ioplane.socket has no NBD socket"
# shellcheck disable=SC2086 # the unit's words, split as systemd splits them
$cmd >"$FUNC_TMP/serve.log" 2>&1 &
pid=$!
at_exit "kill $pid 2>/dev/null"
for _ in $(seq 300); do
	[ -S "$FUNC_TMP/run/$nbd" ] && break
	kill -0 $pid 2>/dev/null || { cat "$FUNC_TMP/serve.log"; fail "the unit's command exited"; }
	sleep 0.1
done
size=$(timeout 30 nbdinfo --size "nbd+unix:///disk?socket=$FUNC_TMP/run/$nbd") ||
	fail "the unit's command serves nothing on $nbd"
[ "$size" = 8388608 ] || fail "size $size"
kill -TERM $pid
wait $pid || fail "the unit's command exited $? on SIGTERM"
echo ok
