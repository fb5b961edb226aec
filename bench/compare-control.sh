#!/bin/bash
# The control plane side by side: ioplane vs qemu-storage-daemon, in one run, the same
# QMP client (Python, plain sockets) driving both:
#   1. cycles: --cycles times blockdev-add + block-export-add + block-export-del +
#      blockdev-del, for NBD and for vhost-user-blk; mean time of one cycle (the export
#      is gone - BLOCK_EXPORT_DELETED received - before the next starts). A daemon that
#      lacks blockdev-add/-del cycles the export only, on a node given on its command
#      line; the table says so.
#   2. disturbance: fio 4 KiB random reads at depth 64 through one NBD export (a null
#      node), --runtime seconds undisturbed, then --runtime seconds while --cycles
#      add/remove cycles of other exports run spread over that time; IOPS drop and
#      p99 latency ratio against the undisturbed run, per daemon.
#   3. memory: RSS of an idle daemon serving --exports NBD exports (half of them
#      vhost-user-blk), against its RSS with none.
# Prints a table and the ioplane/qsd ratios (targets: cycle time <= 0.5x, IOPS drop
# <= 2%, p99 <= 1.2x undisturbed, RSS with exports <= 0.5x).
#
#   bench/compare-control.sh [--cycles N] [--runtime S] [--exports N] [--quick]
#
# A benchmark, not a test: exit 0 whether targets are met or not; 1 when a daemon or
# fio fails; 2 on bad usage. Needs qemu-storage-daemon and fio with its nbd engine.
set -euo pipefail

src=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
IOPLANE=${IOPLANE:-$src/build/ioplane}
cycles=100
runtime=15
exports=100

while [ $# -gt 0 ]; do
	case "$1" in
	--cycles) cycles=$2; shift 2 ;;
	--runtime) runtime=$2; shift 2 ;;
	--exports) exports=$2; shift 2 ;;
	--quick) cycles=20; runtime=5; exports=20; shift ;;
	-h | --help) sed -n '2,/^set /{/^#/s/^# \{0,1\}//p}' "$0"; exit 0 ;;
	*) echo "unknown option $1 (try --help)" >&2; exit 2 ;;
	esac
done
for c in qemu-storage-daemon fio python3; do
	command -v "$c" >/dev/null || { echo "compare-control: $c is not installed" >&2; exit 1; }
done
[ -x "$IOPLANE" ] || { echo "compare-control: no $IOPLANE (ninja -C build)" >&2; exit 1; }

tmp=$(mktemp -d /tmp/ioplane-compare-control.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
export IOPLANE CYCLES=$cycles RUNTIME=$runtime EXPORTS=$exports TMPDIR_CC=$tmp
exec python3 - "$src" <<'EOF'
import json, os, socket, subprocess, sys, threading, time

src = sys.argv[1]
sys.path.insert(0, os.path.join(src, 'tests', 'func'))
from _qmp import Client  # noqa: E402

IOPLANE, TMP = os.environ['IOPLANE'], os.environ['TMPDIR_CC']
CYCLES, RUNTIME, EXPORTS = (int(os.environ[k]) for k in ('CYCLES', 'RUNTIME', 'EXPORTS'))


class Daemon:
    def __init__(self, kind):
        self.kind = kind
        self.qmp = os.path.join(TMP, kind + '.qmp')
        self.nbd = os.path.join(TMP, kind + '-nbd.sock')
        mon = ['--chardev', 'socket,id=m0,path=%s,server=on,wait=off' % self.qmp,
               '--monitor', 'chardev=m0']
        if kind == 'ioplane':
            argv = [IOPLANE, 'serve', '-q', '--iothreads', '1',
                    '--image', 'load,driver=null,size=1G',
                    '--image', 'base,driver=null,size=64M'] + mon
        else:
            argv = ['qemu-storage-daemon',
                    '--blockdev', 'null-co,node-name=load,size=%d' % (1 << 30),
                    '--blockdev', 'null-co,node-name=base,size=%d' % (64 << 20)] + mon
        self.log = open(os.path.join(TMP, kind + '.log'), 'w')
        self.proc = subprocess.Popen(argv, stdout=self.log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL)
        try:
            self.setup(kind)
        except BaseException:  # a daemon that fails to set up is not left running
            self.proc.kill()
            self.proc.wait()
            raise

    def setup(self, kind):
        for _ in range(1000):
            if os.path.exists(self.qmp):
                try:
                    self.c = Client(self.qmp).negotiate()
                    break
                except OSError:
                    pass
            time.sleep(0.01)
        else:
            sys.exit('%s did not start' % kind)
        self.ok(self.c, 'nbd-server-start',
                {'addr': {'type': 'unix', 'data': {'path': self.nbd}}})
        self.ok(self.c, 'block-export-add', {'type': 'nbd', 'id': 'load', 'node-name': 'load'})
        names = {c['name'] for c in self.c.cmd('query-commands')['return']}
        self.blockdev = 'blockdev-add' in names and 'blockdev-del' in names

    def ok(self, c, name, args=None):
        r = c.cmd(name, args)
        if 'error' in r:
            sys.exit('%s: %s %r: %r' % (self.kind, name, args, r))
        return r

    def wait_deleted(self, c, eid):
        while True:
            for e in c.events:
                if e['event'] == 'BLOCK_EXPORT_DELETED' and e['data']['id'] == eid:
                    c.events.remove(e)
                    return
            m = c.recv()
            if 'event' in m:
                c.events.append(m)

    def cycle(self, c, i, vhost):
        node = 'base'
        if self.blockdev:
            node = 'c%d' % i
            self.ok(c, 'blockdev-add', {'driver': 'null-co', 'node-name': node,
                                        'size': 64 << 20})
        if vhost:
            args = {'type': 'vhost-user-blk', 'id': 'x%d' % i, 'node-name': node,
                    'addr': {'type': 'unix', 'path': os.path.join(TMP, 'v%s%d' % (
                        self.kind, i))}}
        else:
            args = {'type': 'nbd', 'id': 'x%d' % i, 'node-name': node, 'name': 'x%d' % i}
        self.ok(c, 'block-export-add', args)
        self.ok(c, 'block-export-del', {'id': 'x%d' % i})
        self.wait_deleted(c, 'x%d' % i)
        if self.blockdev:
            self.ok(c, 'blockdev-del', {'node-name': node})

    def rss_kib(self):
        with open('/proc/%d/status' % self.proc.pid) as f:
            for line in f:
                if line.startswith('VmRSS:'):
                    return int(line.split()[1])
        return 0

    def stop(self):
        try:
            self.c.cmd('quit')
            self.proc.wait(timeout=30)
        except Exception:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


def cycles_ms(d, vhost):
    t = time.monotonic()
    for i in range(CYCLES):
        d.cycle(d.c, i, vhost)
    return (time.monotonic() - t) * 1000 / CYCLES


def fio(d):
    out = subprocess.run(['fio', '--name=r', '--ioengine=nbd',
                          '--uri=nbd+unix:///load?socket=' + d.nbd, '--rw=randread',
                          '--bs=4k', '--iodepth=64', '--time_based', '--runtime=%d' % RUNTIME,
                          '--size=1G', '--output-format=json', '--directory=' + TMP],
                         capture_output=True, text=True)
    if out.returncode:
        sys.exit('%s: fio: %s' % (d.kind, out.stderr[-500:]))
    j = json.loads(out.stdout[out.stdout.index('{'):])['jobs'][0]['read']
    return j['iops'], j['clat_ns']['percentile']['99.000000'] / 1000.0


def disturbed(d):
    # The same client: qsd serves one per monitor; nothing else uses it meanwhile.
    c2 = d.c
    stop = threading.Event()

    def churn():
        gap = RUNTIME / (CYCLES + 1)
        time.sleep(gap)
        for i in range(CYCLES):
            if stop.is_set():
                break
            d.cycle(c2, 1000 + i, i % 2 == 1)
            time.sleep(gap)

    th = threading.Thread(target=churn)
    th.start()
    r = fio(d)
    stop.set()
    th.join()
    return r


def memory(d):
    before = d.rss_kib()
    for i in range(EXPORTS):
        if i % 2:
            args = {'type': 'vhost-user-blk', 'id': 'm%d' % i, 'node-name': 'base',
                    'addr': {'type': 'unix', 'path': os.path.join(TMP, 'm%s%d' % (d.kind, i))}}
        else:
            args = {'type': 'nbd', 'id': 'm%d' % i, 'node-name': 'base', 'name': 'm%d' % i}
        d.ok(d.c, 'block-export-add', args)
    time.sleep(1)
    return before, d.rss_kib()


res = {}
for kind in ('ioplane', 'qsd'):
    d = Daemon(kind)
    try:
        r = res[kind] = {'blockdev': d.blockdev}
        r['cycle nbd ms'] = cycles_ms(d, False)
        r['cycle vhost ms'] = cycles_ms(d, True)
        r['iops'], r['p99 us'] = fio(d)
        r['iops churn'], r['p99 us churn'] = disturbed(d)
        r['rss idle KiB'], r['rss exports KiB'] = memory(d)
    finally:
        d.stop()

print('%-28s %14s %14s %8s' % ('', 'ioplane', 'qsd', 'ratio'))
for k in ('cycle nbd ms', 'cycle vhost ms', 'iops', 'iops churn', 'p99 us', 'p99 us churn',
          'rss idle KiB', 'rss exports KiB'):
    a, b = res['ioplane'][k], res['qsd'][k]
    print('%-28s %14.2f %14.2f %8.2f' % (k, a, b, a / b if b else 0))
for kind in ('ioplane', 'qsd'):
    r = res[kind]
    print('%-8s IOPS drop under churn %.1f%%, p99 churn/undisturbed %.2fx%s' % (
        kind, 100 * (1 - r['iops churn'] / r['iops']), r['p99 us churn'] / r['p99 us'],
        '' if r['blockdev'] else ' (cycles without blockdev-add/-del: not available)'))
print('cycles=%d runtime=%ds exports=%d' % (CYCLES, RUNTIME, EXPORTS))
EOF
