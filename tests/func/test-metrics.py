"""ioplane serve --metrics: the Prometheus endpoint over a unix socket and loopback TCP.

1. The text passes `promtool check metrics`; a write workload through NBD moves the
   node's operation, byte and histogram counters by exactly what it did, and QMP
   query-blockstats / query-iothreads report the same numbers.
2. HTTP: 404 for another path, 405 for another method, 400 for garbage, 431 for a
   request over 8 KiB; HTTP/1.1 connections persist (pipelining too) unless Connection:
   close, HTTP/1.0 or a body says otherwise; slow, half-open and vanishing clients, and
   more clients than the limit, neither stop a scrape nor the NBD export. Scraping
   neither wakes nor runs an idle iothread.
3. --metrics tcp= refuses a non-loopback address unless public=on."""
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _qmp  # noqa: E402

fail = _qmp.fail


class Conn:
    """One connection to the endpoint; reply() reads one HTTP reply up to its
    Content-Length, keeping what follows (a pipelined reply) for the next one."""

    def __init__(self, addr, timeout=10):
        fam = socket.AF_UNIX if isinstance(addr, str) else socket.AF_INET
        self.s = socket.socket(fam, socket.SOCK_STREAM)
        self.s.settimeout(timeout)
        self.s.connect(addr)
        self.buf = b''

    def more(self, what):
        d = self.s.recv(65536)
        if not d:
            fail('EOF inside %s: %r' % (what, self.buf[:200]))
        self.buf += d

    def reply(self):
        """(status line, headers dict, body bytes); a reply that says `Connection:
        close` must be the last: EOF follows it."""
        while b'\r\n\r\n' not in self.buf:
            self.more('the headers')
        head, _, self.buf = self.buf.partition(b'\r\n\r\n')
        lines = head.decode().split('\r\n')
        hdr = dict(l.split(': ', 1) for l in lines[1:] if ': ' in l)
        if 'Content-Length' not in hdr:
            fail('no Content-Length: %r' % head)
        want = int(hdr['Content-Length'])
        while len(self.buf) < want:
            self.more('a body of %d bytes' % want)
        body, self.buf = self.buf[:want], self.buf[want:]
        if hdr.get('Connection') == 'close' and (self.buf or self.s.recv(1) != b''):
            fail('Connection: close but more comes: %r' % self.buf[:100])
        return lines[0], hdr, body

    def close(self):
        self.s.close()


def http(addr, request, timeout=10):
    """Send request bytes on a new connection; return (status line, headers dict, body)."""
    c = Conn(addr, timeout)
    c.s.sendall(request)
    r = c.reply()
    c.close()
    return r


def scrape(addr):
    status, hdr, body = http(addr, b'GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n')
    if status != 'HTTP/1.1 200 OK' or 'version=0.0.4' not in hdr.get('Content-Type', ''):
        fail('scrape: %s %r' % (status, hdr))
    return body.decode()


def samples(text):
    """{'name{labels}': value} of every sample line."""
    out = {}
    for line in text.splitlines():
        if line and not line.startswith('#'):
            k, v = line.rsplit(' ', 1)
            out[k] = float(v)
    return out


def promtool(text, tmp):
    if not shutil.which('promtool'):
        return
    r = subprocess.run(['promtool', 'check', 'metrics'], input=text.encode(),
                       capture_output=True, timeout=60)
    if r.returncode != 0:
        fail('promtool check metrics: %s %s' % (r.stdout.decode(), r.stderr.decode()))


def qemu_io(sock, *cmds, export='n'):
    argv = ['qemu-io', '-f', 'raw']
    for c in cmds:
        argv += ['-c', c]
    argv.append('nbd+unix:///%s?socket=%s' % (export, sock))
    r = subprocess.run(argv, capture_output=True, timeout=60)
    if r.returncode != 0 or b'error' in r.stdout.lower():
        fail('qemu-io %r: %r %r' % (cmds, r.stdout, r.stderr))


def check_histogram(s, node, op):
    pre = 'ioplane_node_latency_seconds'
    lab = 'node="%s",op="%s"' % (node, op)
    buckets = [(k, v) for k, v in s.items()
               if k.startswith(pre + '_bucket{' + lab + ',')]
    vals = [v for _, v in buckets]
    if not buckets or vals != sorted(vals):
        fail('%s buckets not cumulative: %r' % (lab, buckets))
    inf = s[pre + '_bucket{%s,le="+Inf"}' % lab]
    if inf != s[pre + '_count{%s}' % lab] or inf != s['ioplane_node_operations_total{%s}' % lab]:
        fail('%s: +Inf %r, count %r, operations %r' % (lab, inf, s[pre + '_count{%s}' % lab],
                                                      s['ioplane_node_operations_total{%s}' % lab]))


def counters(d, tmp, msock, nsock):
    before = samples(scrape(msock))
    qemu_io(nsock, *['write -P 7 %d 4k' % (i * 4096) for i in range(10)])
    text = scrape(msock)
    promtool(text, tmp)
    after = samples(text)
    w = 'ioplane_node_operations_total{node="n",op="write"}'
    b = 'ioplane_node_bytes_total{node="n",op="write"}'
    if after[w] - before[w] != 10 or after[b] - before[b] != 40960:
        fail('writes: %r -> %r, bytes %r -> %r' % (before[w], after[w], before[b], after[b]))
    check_histogram(after, 'n', 'write')
    if after['ioplane_node_in_flight{node="n"}'] != 0:
        fail('in flight after the workload: %r' % after['ioplane_node_in_flight{node="n"}'])
    for k in ('ioplane_export_info{export="n",type="nbd",node="n"}',
              'ioplane_vhost_user_queues{export="vu"}'):
        if k not in after:
            fail('missing %s' % k)
    if after['ioplane_vhost_user_queues{export="vu"}'] != 3:
        fail('vhost-user queues: %r' % after['ioplane_vhost_user_queues{export="vu"}'])
    c = d.client().negotiate()
    st = [x for x in c.cmd('query-blockstats', {'query-nodes': True})['return']
          if x['node-name'] == 'n'][0]['stats']
    if st['wr_operations'] != after[w] or st['wr_bytes'] != after[b]:
        fail('query-blockstats %r vs metrics %r %r' % (st, after[w], after[b]))
    threads = c.cmd('query-iothreads')['return']
    for t in threads:
        x = t.get('x-ioplane', {})
        m = after.get('ioplane_iothread_rounds_total{iothread="%s"}' % t['id'])
        if m is None or not x or x['rounds'] < m or x['busy-ns'] <= 0:
            fail('query-iothreads %r vs metrics rounds %r' % (t, m))
    if len(threads) != 2:
        fail('query-iothreads: %r' % threads)
    c.close()


def throttle_waits(tmp):
    """A throttle node's waits: 30 writes against a group of 20 IOPS make some wait."""
    msock, nsock = os.path.join(tmp, 't.sock'), os.path.join(tmp, 'tnbd.sock')
    d = _qmp.Daemon('ioplane', tmp, [
        '--object', 'throttle-group,id=tg,limits.iops-total=20',
        '--blockdev', 'driver=null-co,node-name=z,size=67108864',
        '--blockdev', 'driver=throttle,node-name=t,throttle-group=tg,file=z',
        '--nbd-server', 'addr.type=unix,addr.path=' + nsock,
        '--export', 'type=nbd,id=t,node-name=t,writable=on', '--metrics', 'unix=' + msock])
    ok = False
    try:
        _qmp.wait_socket(msock, d.proc)
        _qmp.wait_socket(nsock, d.proc)
        before = samples(scrape(msock))
        qemu_io(nsock, *['write -P 7 %d 4k' % (i * 4096) for i in range(30)], export='t')
        text = scrape(msock)
        promtool(text, tmp)
        after = samples(text)
        w = 'ioplane_node_throttle_waits_total{node="t"}'
        t = 'ioplane_node_throttle_wait_seconds_total{node="t"}'
        if w not in after or after[w] - before.get(w, 0) <= 0 or after[t] <= 0:
            fail('throttle waits not reported: %r %r' % (after.get(w), after.get(t)))
        if after.get('ioplane_node_throttle_waits_total{node="z"}', 0) != 0:
            fail('waits counted on the node below the throttle node')
        ok = True
    finally:
        d.cleanup(ok)


def http_errors(msock):
    for req, want in ((b'GET /foo HTTP/1.1\r\n\r\n', '404'),
                      (b'POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n', '405'),
                      (b'hello\r\n\r\n', '400'),
                      (b'GET /metrics HTTP/1.1\r\nX: ' + b'a' * 9000 + b'\r\n\r\n', '431')):
        status, _, _ = http(msock, req)
        if status.split()[1] != want:
            fail('%r: %s, expected %s' % (req[:40], status, want))


def keep_alive(msock, nsock):
    """HTTP/1.1 connections persist (as Prometheus uses them): two scrapes on one
    connection, the second seeing a workload done in between; pipelined requests
    answered in order; Connection: close, HTTP/1.0 and a request with a body close."""
    c = Conn(msock)
    s = c.s
    get = b'GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n'
    r = 'ioplane_node_operations_total{node="n",op="read"}'
    s.sendall(get)
    st, hdr, body = c.reply()
    if st != 'HTTP/1.1 200 OK' or hdr.get('Connection') != 'keep-alive':
        fail('first scrape on a kept connection: %s %r' % (st, hdr))
    before = samples(body.decode())[r]
    qemu_io(nsock, 'read 0 4k', 'read 4k 4k')
    s.sendall(get)
    st, hdr, body = c.reply()
    if st != 'HTTP/1.1 200 OK' or samples(body.decode())[r] != before + 2:
        fail('second scrape on the same connection: %s, reads %r -> %r'
             % (st, before, samples(body.decode()).get(r)))
    s.sendall(get + b'GET /nope HTTP/1.1\r\n\r\n' + b'GET /metrics HTTP/1.1\r\nConnection: close\r\n\r\n')
    got = [c.reply() for _ in range(3)]
    want = [('HTTP/1.1 200 OK', 'keep-alive'), ('HTTP/1.1 404 Not Found', 'keep-alive'),
            ('HTTP/1.1 200 OK', 'close')]
    if [(g[0], g[1].get('Connection')) for g in got] != want:
        fail('pipelined requests: %r' % [(g[0], g[1]) for g in got])
    c.close()
    for req, conn in ((b'GET /metrics HTTP/1.0\r\n\r\n', 'close'),
                      (b'GET /metrics HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n', 'keep-alive'),
                      (b'POST /metrics HTTP/1.1\r\nContent-Length: 2\r\n\r\nab', 'close')):
        _, hdr, _ = http(msock, req)
        if hdr.get('Connection') != conn:
            fail('%r: Connection %r, expected %s' % (req, hdr.get('Connection'), conn))


def iothread_counts(pid):
    """{tid: (voluntary, involuntary context switches, CPU ns)} of the iothreads."""
    out = {}
    for d in os.listdir('/proc/%d/task' % pid):
        t = '/proc/%d/task/%s/' % (pid, d)
        if open(t + 'comm').read().startswith('iothread'):
            st = dict(l.split(':', 1) for l in open(t + 'status'))
            out[d] = (int(st['voluntary_ctxt_switches']), int(st['nonvoluntary_ctxt_switches']),
                      int(open(t + 'schedstat').read().split()[0]))
    return out


def iothreads_left_alone(pid, msock):
    """A scrape reads the iothreads' counters from the main thread: idle iothreads are
    neither woken (no message, eventfd or lock of theirs) nor run, over 50 scrapes."""
    before = iothread_counts(pid)
    c = Conn(msock)
    for _ in range(50):
        c.s.sendall(b'GET /metrics HTTP/1.1\r\n\r\n')
        if c.reply()[0] != 'HTTP/1.1 200 OK':
            fail('scrape on a kept connection')
    c.close()
    after = iothread_counts(pid)
    if len(before) != 2 or before != after:
        fail('scraping disturbed the idle iothreads: %r -> %r' % (before, after))


def hostile_clients(msock, nsock):
    """Stuck and vanishing clients, more of them than the limit, then a scrape."""
    held = []
    for i in range(40):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(msock)
        s.sendall(b'GET /metr')  # never finished
        held.append(s)
    for i in range(20):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(msock)
        s.sendall(b'GET /metrics HTTP/1.1\r\n\r\n')
        s.close()  # gone before the reply
    scrape(msock)
    qemu_io(nsock, 'read 0 64k')
    # The first stuck clients were pushed out to make room.
    dropped = 0
    for s in held[:8]:
        s.settimeout(10)
        try:
            if s.recv(10) == b'':
                dropped += 1
        except (ConnectionResetError, socket.timeout):
            pass
        s.close()
    for s in held[8:]:
        s.close()
    if dropped != 8:
        fail('%d of the 8 oldest stuck clients were dropped' % dropped)
    scrape(msock)


def tcp(tmp):
    r = subprocess.run([_qmp.IOPLANE, 'serve', '--image', 'n,driver=null,size=1M',
                        '--nbd', 'unix=%s/x.sock,image=n' % tmp, '--metrics', 'tcp=0.0.0.0:9'],
                       capture_output=True, timeout=30)
    if r.returncode != 1 or b'not a loopback address' not in r.stderr:
        fail('--metrics tcp=0.0.0.0: %d %r' % (r.returncode, r.stderr))
    port = _qmp.free_port()
    d = _qmp.Daemon('ioplane', tmp, ['--image', 'n,driver=null,size=1M',
                                     '--metrics', 'tcp=127.0.0.1:%d' % port])
    ok = False
    try:
        for _ in range(100):
            try:
                text = scrape(('127.0.0.1', port))
                break
            except ConnectionRefusedError:
                time.sleep(0.05)
        else:
            fail('no metrics on 127.0.0.1:%d' % port)
        if 'ioplane_build_info' not in text:
            fail('tcp scrape: %r' % text[:200])
        ok = True
    finally:
        d.cleanup(ok)


def main():
    if not shutil.which('qemu-io'):
        _qmp.skip('qemu-io is not installed')
    with tempfile.TemporaryDirectory() as tmp:
        msock, nsock = os.path.join(tmp, 'm.sock'), os.path.join(tmp, 'nbd.sock')
        d = _qmp.Daemon('ioplane', tmp, [
            '--iothreads', '2', '--image', 'n,driver=null,size=64M,read-zeroes=on',
            '--nbd', 'unix=%s,image=n,writable=on' % nsock,
            '--vhost-user-blk', 'unix=%s/vu.sock,image=n,num-queues=3,id=vu' % tmp,
            '--metrics', 'unix=' + msock])
        ok = False
        try:
            _qmp.wait_socket(msock, d.proc)
            if os.stat(msock).st_mode & 0o777 != 0o600:
                fail('metrics socket mode %o' % (os.stat(msock).st_mode & 0o777))
            counters(d, tmp, msock, nsock)
            http_errors(msock)
            keep_alive(msock, nsock)
            iothreads_left_alone(d.proc.pid, msock)
            hostile_clients(msock, nsock)
            if d.proc.poll() is not None:
                fail('the daemon died')
            ok = True
        finally:
            d.cleanup(ok)
        if os.path.exists(msock):
            fail('metrics socket left behind')
        tcp(tmp)
        throttle_waits(tmp)
    if not shutil.which('promtool'):
        _qmp.skip('promtool (Debian prometheus) is not installed; the rest passed')
    print('ok')


main()
