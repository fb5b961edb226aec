#!/bin/bash
# What scraping /metrics costs the dataplane: fio 4 KiB random reads at depth 64 through
# one NBD export of `ioplane serve` (a null node, one iothread), --runs pairs of runs of
# --runtime seconds, in ABBA order without and with a client that GETs /metrics every
# --interval seconds (100 ms) over the --metrics unix socket. Prints each run's IOPS and
# the ratio of the medians, scraped / not scraped (target: >= 0.99, a change <= 1%).
#
# The scraper keeps one HTTP/1.1 connection, as Prometheus does: by default
# bench/metrics-scraper.c, built here with cc (C: about a third of the CPU per scrape
# of a Python loop); --scraper python: a thread of this script on one kept
# connection; --scraper close: that thread with a new connection per scrape. On a 2-core machine
# the scraper's own CPU takes from fio and the iothread and shows in the ratio; a real
# Prometheus usually runs on another host. Each run also shows
# where the CPU went, from /proc and getrusage rather than the clock: the iothread's
# and fio's CPU per request, their context switches (voluntary/involuntary) per
# second, the daemon main thread's and the scraper's CPU per scrape.
#
# --aa scrapes neither side: the ratio is then the noise floor of the machine, to be
# read beside the scraped ratio (more --runs when it is off 1.000 by more than 1%).
#
# --callgrind instead runs the daemon under callgrind (--separate-threads) for a fixed
# --ios requests, without and with the scraper, and prints the iothread's instructions
# per request in both and their ratio: the I/O path's cost, whatever the machine's load
# (with the epoll loop backend, which valgrind can follow), and the main thread's
# instructions per scrape.
#
#   bench/compare-metrics.sh [--runs N] [--runtime S] [--interval S] [--aa]
#                            [--scraper c|python|close] [--quick]
#   bench/compare-metrics.sh --callgrind [--ios N] [--scraper c|python|close]
#
# A benchmark, not a test: exit 0 whether the target is met or not; 1 when the daemon
# or fio fails; 2 on bad usage. Needs fio with its nbd engine, cc for the default
# scraper (and valgrind for --callgrind).
set -euo pipefail

src=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
IOPLANE=${IOPLANE:-$src/build/ioplane}
runs=5
runtime=10
interval=0.1
callgrind=0
ios=20000
aa=0
scraper=c

while [ $# -gt 0 ]; do
	case "$1" in
	--runs) runs=$2; shift 2 ;;
	--runtime) runtime=$2; shift 2 ;;
	--interval) interval=$2; shift 2 ;;
	--ios) ios=$2; shift 2 ;;
	--callgrind) callgrind=1; shift ;;
	--aa) aa=1; shift ;;
	--scraper)
		case "$2" in c | python | close) scraper=$2 ;;
		*) echo "--scraper c|python|close" >&2; exit 2 ;; esac
		shift 2 ;;
	--quick) runs=2; runtime=3; ios=4000; shift ;;
	-h | --help) sed -n '2,/^set /{/^#/s/^# \{0,1\}//p}' "$0"; exit 0 ;;
	*) echo "unknown option $1 (try --help)" >&2; exit 2 ;;
	esac
done
need=(fio python3)
[ "$scraper" = c ] && need+=("${CC:-cc}")
[ "$callgrind" = 1 ] && need+=(valgrind callgrind_annotate)
for c in "${need[@]}"; do
	command -v "$c" >/dev/null || { echo "compare-metrics: $c is not installed" >&2; exit 1; }
done
[ -x "$IOPLANE" ] || { echo "compare-metrics: no $IOPLANE (ninja -C build)" >&2; exit 1; }

tmp=$(mktemp -d /tmp/ioplane-compare-metrics.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
if [ "$scraper" = c ]; then
	"${CC:-cc}" -O2 -D_GNU_SOURCE -o "$tmp/scraper" "$src/bench/metrics-scraper.c" ||
		{ echo "compare-metrics: cannot build bench/metrics-scraper.c" >&2; exit 1; }
fi
export IOPLANE RUNS=$runs RUNTIME=$runtime INTERVAL=$interval CALLGRIND=$callgrind IOS=$ios \
	TMPDIR_CM=$tmp AA=$aa SCRAPER=$scraper
python3 - <<'EOF' || exit $?
import glob, json, os, re, resource, signal, socket, statistics, subprocess, sys, threading, time

IOPLANE, TMP = os.environ['IOPLANE'], os.environ['TMPDIR_CM']
RUNS, RUNTIME, IOS = int(os.environ['RUNS']), int(os.environ['RUNTIME']), int(os.environ['IOS'])
INTERVAL, CALLGRIND = float(os.environ['INTERVAL']), os.environ['CALLGRIND'] == '1'
AA, SCRAPER = os.environ['AA'] == '1', os.environ['SCRAPER']
KEEP = SCRAPER != 'close'
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


class Client:
    """GET /metrics as Prometheus does: one HTTP/1.1 connection kept between scrapes
    (KEEP), read up to Content-Length; a new connection when the server closes it, or
    for every scrape with --scraper close."""

    def __init__(self):
        self.s, self.connects = None, 0

    def scrape(self):
        if self.s is None:
            self.s = socket.socket(socket.AF_UNIX)
            self.s.settimeout(10)
            self.s.connect(MET)
            self.connects += 1
        self.s.sendall(b'GET /metrics HTTP/1.1\r\nHost: x\r\n' +
                       (b'' if KEEP else b'Connection: close\r\n') + b'\r\n')
        buf = b''
        while b'\r\n\r\n' not in buf:
            buf += self.recv()
        head, _, body = buf.partition(b'\r\n\r\n')
        if not head.startswith(b'HTTP/1.1 200'):
            sys.exit('compare-metrics: scrape: %r' % head[:100])
        hdr = dict(l.split(b':', 1) for l in head.split(b'\r\n')[1:] if b':' in l)
        hdr = {k.strip().lower(): v.strip().lower() for k, v in hdr.items()}
        want = int(hdr[b'content-length'])
        while len(body) < want:
            body += self.recv()
        if hdr.get(b'connection') == b'close':
            self.close()
        return len(body)

    def recv(self):
        d = self.s.recv(65536)
        if not d:
            sys.exit('compare-metrics: the metrics connection closed mid-reply')
        return d

    def close(self):
        if self.s:
            self.s.close()
        self.s = None


class Scraper(threading.Thread):
    """A thread of this script that scrapes every INTERVAL seconds on a fixed schedule;
    counts its own CPU and context switches (getrusage of this thread)."""

    def __init__(self):
        super().__init__(daemon=True)
        self.halt, self.n, self.client = threading.Event(), 0, Client()

    def run(self):
        r0 = resource.getrusage(resource.RUSAGE_THREAD)
        due = time.monotonic() + INTERVAL
        while not self.halt.wait(max(due - time.monotonic(), 0)):
            self.client.scrape()
            self.n += 1
            due += INTERVAL
        r1 = resource.getrusage(resource.RUSAGE_THREAD)
        self.client.close()
        self.connects = self.client.connects
        self.cpu = r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime
        self.csw = r1.ru_nvcsw + r1.ru_nivcsw - r0.ru_nvcsw - r0.ru_nivcsw

    def finish(self):
        self.halt.set()
        self.join()


class CScraper:
    """bench/metrics-scraper.c: `count` GETs on one kept connection, every INTERVAL;
    it reports its CPU and context switches (getrusage) when done."""

    def __init__(self, count):
        self.p = subprocess.Popen([os.path.join(TMP, 'scraper'), MET, str(count),
                                   repr(INTERVAL)], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True)

    def start(self):
        pass

    def finish(self):
        out, err = self.p.communicate()
        if self.p.returncode:
            sys.exit('compare-metrics: metrics-scraper: %d %s' % (self.p.returncode, err))
        n, connects, us, csw = (int(x) for x in out.split())
        self.n, self.connects, self.cpu, self.csw = n, connects, us / 1e6, csw


def scraper(seconds):
    """The --scraper for a run of about `seconds` (the C one's count is fixed up front)."""
    if SCRAPER == 'c':
        return CScraper(max(int(seconds / INTERVAL), 1))
    return Scraper()


def thread_counts(pid):
    """{name: (CPU ns, voluntary, involuntary context switches, CPU migrations)} of the
    daemon's threads: schedstat's run time is in ns (stat's ticks are 10 ms, too coarse
    for a scrape)."""
    out = {}
    for d in glob.glob('/proc/%d/task/*' % pid):
        try:
            ns = int(open(d + '/schedstat').read().split()[0])
            st = dict(l.split(':', 1) for l in open(d + '/status'))
            comm = open(d + '/comm').read().strip()
            mig = [l.split(':')[1] for l in open(d + '/sched') if 'nr_migrations' in l]
        except OSError:
            continue
        out[comm if comm.startswith('iothread') else 'main' if int(os.path.basename(d)) == pid
            else comm] = (ns, int(st['voluntary_ctxt_switches']),
                          int(st['nonvoluntary_ctxt_switches']), int(float(mig[0])) if mig else 0)
    return out


def interrupts():
    """Rescheduling (RES) and function-call (CAL) IPIs, all CPUs."""
    n = {}
    for l in open('/proc/interrupts'):
        f = l.split()
        if f and f[0] in ('RES:', 'CAL:'):
            n[f[0][:3]] = sum(int(x) for x in f[1:] if x.isdigit())
    return n


def fio(extra):
    """fio's JSON read result, with its CPU and context switches (fio and its job
    process are children: getrusage(RUSAGE_CHILDREN) around the run)."""
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = subprocess.run(['fio', '--name=r', '--ioengine=nbd',
                          '--uri=nbd+unix:///load?socket=' + NBD, '--rw=randread', '--bs=4k',
                          '--iodepth=64', '--size=1G', '--output-format=json'] + extra,
                         capture_output=True, text=True)
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    if out.returncode:
        sys.exit('compare-metrics: fio: %s' % out.stderr[-500:])
    r = json.loads(out.stdout[out.stdout.index('{'):])['jobs'][0]['read']
    r['cpu'] = r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime
    r['vcsw'], r['icsw'] = r1.ru_nvcsw - r0.ru_nvcsw, r1.ru_nivcsw - r0.ru_nivcsw
    return r


def run(scraped, extra, seconds):
    sc = scraper(seconds) if scraped else None
    if sc:
        sc.start()
    r = fio(extra)
    if sc:
        sc.finish()
    return r, sc


def one_run(p, i, scraped):
    """One fio run; prints its line and returns (IOPS, main thread CPU ns, scraper,
    fio's and the iothread's CPU ns)."""
    t0, q0 = thread_counts(p.pid), interrupts()
    r, sc = run(scraped, ['--time_based', '--runtime=%d' % RUNTIME], RUNTIME)
    t1, q1 = thread_counts(p.pid), interrupts()
    d = {k: [b - a for a, b in zip(t0[k], t1[k])] for k in t1 if k in t0}
    ios, secs = max(r['total_ios'], 1), RUNTIME
    io, main = d.get('iothread0', [0] * 4), d.get('main', [0] * 4)
    print('run %d %-11s %8.0f IOPS | ns/IO iothread %5.0f fio %5.0f | csw/s (vol/invol) '
          'iothread %d/%d fio %d/%d | iothread migrations/s %.1f | IPI/s RES %d CAL %d | '
          'main thread %.1f ms'
          % (i + 1, 'scraped' if sc else 'not scraped', r['iops'], io[0] / ios,
             r['cpu'] * 1e9 / ios, io[1] / secs, io[2] / secs, r['vcsw'] / secs,
             r['icsw'] / secs, io[3] / secs, (q1['RES'] - q0['RES']) / secs,
             (q1['CAL'] - q0['CAL']) / secs, main[0] / 1e6), flush=True)
    if sc:
        n = max(sc.n, 1)
        print('      %d scrapes on %d connection(s); per scrape: scraper %.0f us of CPU and '
              '%.1f context switches, daemon main thread %.1f/%.1f (vol/invol)'
              % (sc.n, sc.connects, sc.cpu * 1e6 / n, sc.csw / n, main[1] / n, main[2] / n),
              flush=True)
    return r['iops'], main[0], sc, r['cpu'] * 1e9 + io[0]


def timed():
    p = start()
    b_name = 'not scraped (A\')' if AA else 'scraped every %g s' % INTERVAL
    res = {False: [], True: []}
    try:
        for i in range(RUNS):
            # ABBA order: a drift through the invocation (the machine's other load, the
            # page cache, the CPU's clock) falls on both sides alike.
            for b in ((False, True) if i % 2 == 0 else (True, False)):
                res[b].append(one_run(p, i, b and not AA))
    finally:
        stop(p)
    med = lambda b, k: statistics.median(x[k] for x in res[b])
    a, b = med(False, 0), med(True, 0)
    print('median IOPS: not scraped %.0f, %s %.0f' % (a, b_name, b))
    # The spread of the pairs' own ratios: how far one pair is from the median ratio.
    pr = sorted(y[0] / x[0] for x, y in zip(res[False], res[True]))
    print('ratio of each pair: %s (from %.3f to %.3f)'
          % (' '.join('%.3f' % r for r in pr), pr[0], pr[-1]))
    if not AA:
        n = statistics.median(x[2].n for x in res[True])
        # The main thread also serves fio's NBD handshake: a run without scraping is
        # the baseline.
        main = (med(True, 1) - med(False, 1)) / max(n, 1)
        scr = statistics.median(x[2].cpu / max(x[2].n, 1) for x in res[True]) * 1e9
        print('median CPU per scrape: daemon main thread %.0f us, scraper (%s) %.0f us'
              % (main / 1e3, {'c': 'C, one kept connection', 'python': 'python, one kept '
                              'connection', 'close': 'python, a connection per scrape'}[SCRAPER],
                 scr / 1e3))
        # A count, not a time: what the scrapes took from the CPUs fio and the iothread
        # fill, the loss to expect where they share them (not the noise of the clock).
        dp = statistics.median(x[3] for x in res[True])
        print('CPU of the scrapes / CPU of fio and the iothread: daemon %.2f%%, scraper '
              '%.2f%%' % (100 * main * n / dp, 100 * scr * n / dp))
        print('ratio scraped/not scraped: %.3f (target >= 0.99)' % (b / a))
    else:
        print('ratio A\'/A (the noise floor, neither side scraped): %.3f' % (b / a))


def thread_ir(prefix):
    """Instructions of the main thread and of the others, from callgrind's files."""
    main = other = 0
    for f in glob.glob(prefix + '*'):
        m = re.search(r'-(\d+)$', f)
        if not m:
            continue
        with open(f) as fh:
            for line in fh:
                if line.startswith('summary:') or line.startswith('totals:'):
                    if int(m.group(1)) == 1:
                        main += int(line.split()[1])
                    else:
                        other += int(line.split()[1])
                    break
    return main, other


def callgrind():
    res, mains = {}, {}
    for scraped in (False, True):
        prefix = os.path.join(TMP, 'cg-%d.out' % scraped)
        p = start(['valgrind', '--tool=callgrind', '--separate-threads=yes',
                   '--callgrind-out-file=' + prefix])
        try:
            # Under callgrind fio takes about 1 s per 2000 requests.
            r, sc = run(scraped, ['--number_ios=%d' % IOS, '--io_size=%d' % (IOS * 4096)],
                        IOS / 2000)
        finally:
            stop(p)
        mains[scraped], other = thread_ir(prefix)
        res[scraped] = other / max(r['total_ios'], 1)
        print('%-11s %8.0f iothread instructions per request (%d requests%s)'
              % ('scraped' if scraped else 'not scraped', res[scraped], r['total_ios'],
                 ', %d scrapes' % sc.n if sc else ''))
        if sc:
            print('main thread: %.0f instructions per scrape (beyond the unscraped run)'
                  % ((mains[True] - mains[False]) / max(sc.n, 1)))
    print('ratio scraped/not scraped: %.4f' % (res[True] / res[False]))


callgrind() if CALLGRIND else timed()
EOF
