#!/bin/bash
# What scraping /metrics costs the dataplane: fio 4 KiB random reads at depth 64 through
# one NBD export of `ioplane serve` (a null node, one iothread), --runs pairs of runs of
# --runtime seconds, in ABBA order without and with a client that GETs /metrics every
# --interval seconds (100 ms) over the --metrics unix socket. Prints each run's IOPS and
# the ratio of the medians, scraped / not scraped (target: >= 0.99, a change <= 1%).
#
# --callgrind instead runs the daemon under callgrind (--separate-threads) for a fixed
# --ios requests, without and with the scraper, and prints the iothread's instructions
# per request in both and their ratio: the I/O path's cost, whatever the machine's load
# (with the epoll loop backend, which valgrind can follow).
#
#   bench/compare-metrics.sh [--runs N] [--runtime S] [--interval S] [--quick]
#   bench/compare-metrics.sh --callgrind [--ios N]
#
# A benchmark, not a test: exit 0 whether the target is met or not; 1 when the daemon
# or fio fails; 2 on bad usage. Needs fio with its nbd engine (and valgrind for
# --callgrind).
set -euo pipefail

src=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
IOPLANE=${IOPLANE:-$src/build/ioplane}
runs=5
runtime=10
interval=0.1
callgrind=0
ios=20000

while [ $# -gt 0 ]; do
	case "$1" in
	--runs) runs=$2; shift 2 ;;
	--runtime) runtime=$2; shift 2 ;;
	--interval) interval=$2; shift 2 ;;
	--ios) ios=$2; shift 2 ;;
	--callgrind) callgrind=1; shift ;;
	--quick) runs=2; runtime=3; ios=4000; shift ;;
	-h | --help) sed -n '2,/^set /{/^#/s/^# \{0,1\}//p}' "$0"; exit 0 ;;
	*) echo "unknown option $1 (try --help)" >&2; exit 2 ;;
	esac
done
need=(fio python3)
[ "$callgrind" = 1 ] && need+=(valgrind callgrind_annotate)
for c in "${need[@]}"; do
	command -v "$c" >/dev/null || { echo "compare-metrics: $c is not installed" >&2; exit 1; }
done
[ -x "$IOPLANE" ] || { echo "compare-metrics: no $IOPLANE (ninja -C build)" >&2; exit 1; }

tmp=$(mktemp -d /tmp/ioplane-compare-metrics.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
export IOPLANE RUNS=$runs RUNTIME=$runtime INTERVAL=$interval CALLGRIND=$callgrind IOS=$ios \
	TMPDIR_CM=$tmp
exec python3 - <<'EOF'
import glob, json, os, re, signal, socket, statistics, subprocess, sys, threading, time

IOPLANE, TMP = os.environ['IOPLANE'], os.environ['TMPDIR_CM']
RUNS, RUNTIME, IOS = int(os.environ['RUNS']), int(os.environ['RUNTIME']), int(os.environ['IOS'])
INTERVAL, CALLGRIND = float(os.environ['INTERVAL']), os.environ['CALLGRIND'] == '1'
NBD, MET = os.path.join(TMP, 'nbd.sock'), os.path.join(TMP, 'metrics.sock')


def start(prefix=()):
    argv = list(prefix) + [IOPLANE, 'serve', '-q', '--iothreads', '1',
                           '--image', 'load,driver=null,size=1G',
                           '--nbd', 'unix=%s,image=load' % NBD, '--metrics', 'unix=' + MET]
    log = open(os.path.join(TMP, 'serve.log'), 'a')
    global LOG
    LOG = log.name
    # valgrind does not follow the io_uring loop's waits: the epoll loop under callgrind.
    env = dict(os.environ, IOPLANE_LOOP_BACKEND='epoll') if prefix else None
    p = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                         env=env)
    for _ in range(12000 if prefix else 1000):
        if p.poll() is not None:
            sys.exit('compare-metrics: the daemon exited %d: %s' % (p.returncode, open(LOG).read()[-500:]))
        if os.path.exists(NBD) and os.path.exists(MET):
            return p
        time.sleep(0.01)
    p.kill()
    sys.exit('compare-metrics: the daemon does not listen')


def stop(p):
    p.send_signal(signal.SIGTERM)
    try:
        p.wait(timeout=120)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()


def scrape():
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(10)
    s.connect(MET)
    s.sendall(b'GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n')
    data = b''
    while True:
        d = s.recv(65536)
        if not d:
            break
        data += d
    s.close()
    if not data.startswith(b'HTTP/1.1 200'):
        sys.exit('compare-metrics: scrape: %r' % data[:100])
    return len(data)


class Scraper(threading.Thread):
    def __init__(self):
        super().__init__(daemon=True)
        self.halt, self.n = threading.Event(), 0

    def run(self):
        while not self.halt.wait(INTERVAL):
            scrape()
            self.n += 1
        self.cpu = time.thread_time()


def main_thread_cpu(p):
    """CPU seconds the daemon's main thread (it serves /metrics) has used."""
    with open('/proc/%d/task/%d/stat' % (p.pid, p.pid)) as f:
        v = f.read().rsplit(')', 1)[1].split()
    return (int(v[11]) + int(v[12])) / os.sysconf('SC_CLK_TCK')


def fio(extra):
    out = subprocess.run(['fio', '--name=r', '--ioengine=nbd',
                          '--uri=nbd+unix:///load?socket=' + NBD, '--rw=randread', '--bs=4k',
                          '--iodepth=64', '--size=1G', '--output-format=json'] + extra,
                         capture_output=True, text=True)
    if out.returncode:
        sys.exit('compare-metrics: fio: %s' % out.stderr[-500:])
    return json.loads(out.stdout[out.stdout.index('{'):])['jobs'][0]['read']


def run(scraped, extra):
    sc = Scraper() if scraped else None
    if sc:
        sc.start()
    r = fio(extra)
    if sc:
        sc.halt.set()
        sc.join()
    return r, sc


def timed():
    p = start()
    try:
        iops = {False: [], True: []}
        for i in range(RUNS):
            # ABBA order: a drift through the invocation (the machine's other load, the
            # page cache, the CPU's clock) falls on both sides alike.
            for scraped in ((False, True) if i % 2 == 0 else (True, False)):
                m0 = main_thread_cpu(p)
                r, sc = run(scraped, ['--time_based', '--runtime=%d' % RUNTIME])
                m1 = main_thread_cpu(p)
                iops[scraped].append(r['iops'])
                # Where a scrape's CPU goes: the daemon's main thread, and the scraper
                # itself, which shares this machine's cores with fio and the iothread.
                what = (' (%d scrapes; daemon main thread %.0f ms, scraper %.0f ms of CPU)'
                        % (sc.n, (m1 - m0) * 1e3, sc.cpu * 1e3) if sc else '')
                print('run %d %-11s %10.0f IOPS%s' % (i + 1, 'scraped' if scraped else 'not scraped',
                                                     r['iops'], what))
    finally:
        stop(p)
    a, b = statistics.median(iops[False]), statistics.median(iops[True])
    print('median IOPS: not scraped %.0f, scraped every %g s %.0f' % (a, INTERVAL, b))
    print('ratio scraped/not scraped: %.3f (target >= 0.99)' % (b / a))


def iothread_ir(prefix):
    """Instructions of the threads other than the main one, from callgrind's files."""
    total = 0
    for f in glob.glob(prefix + '*'):
        m = re.search(r'-(\d+)$', f)
        if not m or int(m.group(1)) == 1:
            continue
        with open(f) as fh:
            for line in fh:
                if line.startswith('summary:') or line.startswith('totals:'):
                    total += int(line.split()[1])
                    break
    return total


def callgrind():
    res = {}
    for scraped in (False, True):
        prefix = os.path.join(TMP, 'cg-%d.out' % scraped)
        p = start(['valgrind', '--tool=callgrind', '--separate-threads=yes',
                   '--callgrind-out-file=' + prefix])
        try:
            r, sc = run(scraped, ['--number_ios=%d' % IOS, '--io_size=%d' % (IOS * 4096)])
        finally:
            stop(p)
        res[scraped] = iothread_ir(prefix) / max(r['total_ios'], 1)
        print('%-11s %8.0f iothread instructions per request (%d requests%s)'
              % ('scraped' if scraped else 'not scraped', res[scraped], r['total_ios'],
                 ', %d scrapes' % sc.n if sc else ''))
    print('ratio scraped/not scraped: %.4f' % (res[True] / res[False]))


callgrind() if CALLGRIND else timed()
EOF
