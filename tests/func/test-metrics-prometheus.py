"""A real Prometheus server (Debian prometheus) scrapes `ioplane serve --metrics
tcp=127.0.0.1:PORT` every second; the test writes through NBD and asks Prometheus'
HTTP API for the node's write counter until it shows the writes (bounded wait)."""
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _qmp  # noqa: E402

fail = _qmp.fail
WAIT_S = 120  # Prometheus starts slowly on a loaded machine


def query(port, expr):
    url = 'http://127.0.0.1:%d/api/v1/query?%s' % (port, urllib.parse.urlencode({'query': expr}))
    with urllib.request.urlopen(url, timeout=10) as r:
        doc = json.load(r)
    if doc.get('status') != 'success':
        fail('query %s: %r' % (expr, doc))
    return doc['data']['result']


def wait_value(port, expr, want, proc):
    deadline = time.monotonic() + WAIT_S
    last = None
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            fail('prometheus exited %d' % proc.returncode)
        try:
            res = query(port, expr)
            last = res
            if res and float(res[0]['value'][1]) >= want:
                return res
        except OSError:
            pass
        time.sleep(0.5)
    fail('%s did not reach %r within %d s: %r' % (expr, want, WAIT_S, last))


def start_prometheus(tmp, target, port):
    cfg = os.path.join(tmp, 'prometheus.yml')
    with open(cfg, 'w') as f:
        f.write('global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n'
                'scrape_configs:\n  - job_name: ioplane\n    static_configs:\n'
                '      - targets: ["%s"]\n' % target)
    log = open(os.path.join(tmp, 'prometheus.log'), 'w')
    return subprocess.Popen(['prometheus', '--config.file=' + cfg,
                             '--storage.tsdb.path=' + os.path.join(tmp, 'data'),
                             '--web.listen-address=127.0.0.1:%d' % port],
                            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)


def main():
    if not shutil.which('prometheus'):
        _qmp.skip('prometheus (Debian prometheus) is not installed')
    if not shutil.which('qemu-io'):
        _qmp.skip('qemu-io is not installed')
    with tempfile.TemporaryDirectory() as tmp:
        mport, pport = _qmp.free_port(), _qmp.free_port()
        while pport == mport:
            pport = _qmp.free_port()
        nsock = os.path.join(tmp, 'nbd.sock')
        d = _qmp.Daemon('ioplane', tmp, [
            '--image', 'disk,driver=null,size=64M,read-zeroes=on',
            '--nbd', 'unix=%s,image=disk,writable=on' % nsock,
            '--metrics', 'tcp=127.0.0.1:%d' % mport])
        prom = None
        ok = False
        try:
            prom = start_prometheus(tmp, '127.0.0.1:%d' % mport, pport)
            up = 'up{job="ioplane"}'
            wait_value(pport, up, 1, prom)
            expr = 'ioplane_node_operations_total{node="disk",op="write"}'
            wait_value(pport, expr, 0, prom)
            r = subprocess.run(['qemu-io', '-f', 'raw'] +
                               sum((['-c', 'write %d 4k' % (i * 4096)] for i in range(25)), []) +
                               ['nbd+unix:///disk?socket=' + nsock],
                               capture_output=True, timeout=60)
            if r.returncode != 0:
                fail('qemu-io: %r' % r.stderr)
            res = wait_value(pport, expr, 25, prom)
            if float(res[0]['value'][1]) != 25:
                fail('Prometheus has %r, expected 25 writes' % res)
            hist = 'ioplane_node_latency_seconds_count{node="disk",op="write"}'
            wait_value(pport, hist, 25, prom)
            ok = True
        finally:
            if prom and prom.poll() is None:
                prom.send_signal(signal.SIGTERM)
                try:
                    prom.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    prom.kill()
                    prom.wait()
            if not ok:
                with open(os.path.join(tmp, 'prometheus.log')) as f:
                    print('---- prometheus log\n' + f.read()[-3000:])
            d.cleanup(ok)
    print('ok')


main()
