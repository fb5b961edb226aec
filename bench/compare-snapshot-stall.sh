#!/bin/bash
# The longest request stall during a live external snapshot, ioplane vs
# qemu-storage-daemon in one run (row 3 of compare-backup.sh, which calls this):
# each daemon exports a fresh qcow2 image (--size) over NBD; fio
# (nbd engine, 4 KiB randwrite, depth 16, --runtime seconds) writes to it while
# blockdev-snapshot-sync is taken --snapshots times, spread over the run. fio's
# completion latency maximum (clat max) is the longest stall a request saw; the
# same run without snapshots gives the undisturbed maximum. Prints a table and the
# ioplane/qsd ratio of the stall (target: <= 1).
#
#   bench/compare-snapshot-stall.sh [--size SIZE] [--runtime S] [--snapshots N] [--quick]
#
# A benchmark, not a test: exit 0 whether the target is met or not; 1 when a daemon
# or fio fails; 2 on bad usage. Needs qemu-storage-daemon, qemu-img and fio with its
# nbd engine.
set -euo pipefail

src=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
IOPLANE=${IOPLANE:-$src/build/ioplane}
size=1G
runtime=20
snapshots=4

while [ $# -gt 0 ]; do
	case "$1" in
	--size) size=$2; shift 2 ;;
	--runtime) runtime=$2; shift 2 ;;
	--snapshots) snapshots=$2; shift 2 ;;
	--quick) size=256M; runtime=4; snapshots=2; shift ;;
	-h | --help) sed -n '2,/^set /{/^#/s/^# \{0,1\}//p}' "$0"; exit 0 ;;
	*) echo "unknown option $1 (try --help)" >&2; exit 2 ;;
	esac
done
for c in qemu-storage-daemon qemu-img fio python3; do
	command -v "$c" >/dev/null || { echo "compare-snapshot-stall: $c is not installed" >&2; exit 1; }
done
[ -x "$IOPLANE" ] || { echo "compare-snapshot-stall: no $IOPLANE (ninja -C build)" >&2; exit 1; }

tmp=$(mktemp -d /tmp/ioplane-compare-snap.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
export IOPLANE SIZE=$size RUNTIME=$runtime SNAPSHOTS=$snapshots TMPDIR_CS=$tmp
exec python3 - "$src" <<'EOF'
import json, os, subprocess, sys, time
sys.path.insert(0, os.path.join(sys.argv[1], 'tests', 'func'))
from _qmp import Daemon  # noqa: E402

tmp, size = os.environ['TMPDIR_CS'], os.environ['SIZE']
runtime, nsnap = int(os.environ['RUNTIME']), int(os.environ['SNAPSHOTS'])


def die(msg):
    print('compare-snapshot-stall:', msg, file=sys.stderr)
    sys.exit(1)


def one(kind, snap):
    d = os.path.join(tmp, '%s-%s' % (kind, 'snap' if snap else 'plain'))
    os.mkdir(d)
    img, sock = os.path.join(d, 'base.qcow2'), os.path.join(d, 'nbd.sock')
    subprocess.run(['qemu-img', 'create', '-q', '-f', 'qcow2', img, size], check=True)
    dm = Daemon(kind, d, [
        '--blockdev', 'driver=file,filename=%s,node-name=f' % img,
        '--blockdev', 'driver=qcow2,file=f,node-name=n0'])
    ok = False
    try:
        c = dm.client().negotiate()
        # No iothread: qsd 7.2 aborts (nbd_blockdev_client_closed) when a client of
        # an export on an iothread leaves, and fio's nbd engine connects twice.
        for cmd, args in (('nbd-server-start', {'addr': {'type': 'unix', 'data': {'path': sock}}}),
                          ('block-export-add', {'type': 'nbd', 'id': 'e', 'node-name': 'n0',
                                                'writable': True})):
            r = c.cmd(cmd, args)
            if r != {'return': {}}:
                die('%s: %s: %r' % (kind, cmd, r))
        fio = subprocess.Popen(
            ['fio', '--name=stall', '--ioengine=nbd', '--uri=nbd+unix:///n0?socket=' + sock,
             '--rw=randwrite', '--bs=4k', '--iodepth=16', '--time_based',
             '--runtime=%d' % runtime, '--output-format=json'],
            cwd=d, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        worst = 0.0
        for i in range(nsnap if snap else 0):
            time.sleep(runtime / (nsnap + 1))
            t = time.monotonic()
            r = c.cmd('blockdev-snapshot-sync', {
                'node-name': 'n%d' % i, 'snapshot-node-name': 'n%d' % (i + 1),
                'snapshot-file': os.path.join(d, 'o%d.qcow2' % (i + 1))})
            worst = max(worst, time.monotonic() - t)
            if r != {'return': {}}:
                die('%s: blockdev-snapshot-sync: %r' % (kind, r))
        out, err = fio.communicate(timeout=runtime + 120)
        if fio.returncode:
            die('%s: fio: %s' % (kind, err[-2000:]))
        j = json.loads(out[out.index('{'):])['jobs'][0]['write']
        c.cmd('quit')
        dm.wait()
        ok = True
    finally:
        dm.cleanup(ok)
    return j['clat_ns']['max'] / 1e6, j['iops'], worst * 1e3


res = {}
for kind in ('ioplane', 'qsd'):
    res[kind] = (one(kind, False), one(kind, True))
print('%-8s %16s %16s %12s %14s' % ('daemon', 'stall plain ms', 'stall snap ms', 'IOPS snap',
                                     'QMP reply ms'))
for kind, (plain, snap) in res.items():
    print('%-8s %16.2f %16.2f %12.0f %14.2f' % (kind, plain[0], snap[0], snap[1], snap[2]))
ratio = res['ioplane'][1][0] / max(res['qsd'][1][0], 1e-9)
print('stall during blockdev-snapshot-sync, ioplane/qsd: %.2f (target <= 1)' % ratio)
EOF
