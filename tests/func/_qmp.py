"""QMP for the functional tests, over plain sockets (Debian 12 packages no Python QMP
client): a client with bounded waits, and a daemon - `ioplane serve` or
qemu-storage-daemon - started with the same --chardev/--monitor command line."""
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import time

WAIT_S = 10
IOPLANE = os.environ.get('IOPLANE') or os.path.join(
    os.environ.get('IOPLANE_BUILD', 'build'), 'ioplane')
QSD = shutil.which('qemu-storage-daemon')


def fail(msg):
    print('FAIL:', msg)
    sys.exit(1)


def skip(msg):
    print('SKIP:', msg)
    sys.exit(77)


class Closed(Exception):
    pass


class Client:
    """One QMP connection. recv() returns the next message (a dict), waiting at most
    WAIT_S; events met by cmd() are kept in self.events."""

    def __init__(self, path, greet=True):
        self.s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.s.settimeout(WAIT_S)
        self.s.connect(path)
        self.buf = b''
        self.events = []
        self.greeting = self.recv() if greet else None

    def send(self, data):
        self.s.sendall(data if isinstance(data, bytes) else data.encode())

    def recv(self, timeout=WAIT_S):
        deadline = time.monotonic() + timeout
        while b'\n' not in self.buf:
            left = deadline - time.monotonic()
            r, _, _ = select.select([self.s], [], [], max(left, 0))
            if not r:
                raise TimeoutError('no message in %.1f s' % timeout)
            d = self.s.recv(65536)
            if not d:
                raise Closed('connection closed')
            self.buf += d
        line, self.buf = self.buf.split(b'\n', 1)
        if not line.endswith(b'\r'):
            fail('a server message does not end with CRLF: %r' % line[:200])
        return json.loads(line)

    def reply(self):
        """The next message that is not an event."""
        while True:
            m = self.recv()
            if 'event' not in m:
                return m
            self.events.append(m)

    def cmd(self, name, args=None, **extra):
        req = {'execute': name}
        if args is not None:
            req['arguments'] = args
        req.update(extra)
        self.send(json.dumps(req))
        return self.reply()

    def wait_event(self, name, data=None, timeout=WAIT_S):
        """Take the first event NAME (with exactly DATA, if given) from those met so
        far or arriving within timeout; None if none came."""
        deadline = time.monotonic() + timeout
        while True:
            for e in self.events:
                if e['event'] == name and (data is None or e.get('data') == data):
                    self.events.remove(e)
                    return e
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            try:
                m = self.recv(min(left, 1))
            except TimeoutError:
                continue
            if 'event' in m:
                self.events.append(m)

    def negotiate(self):
        r = self.cmd('qmp_capabilities')
        if r != {'return': {}}:
            fail('qmp_capabilities: %r' % r)
        return self

    def closed(self, timeout=WAIT_S):
        """True once the server has closed the connection (after any messages)."""
        try:
            while True:
                m = self.recv(timeout)
                if 'event' in m:
                    self.events.append(m)
        except (Closed, ConnectionResetError):  # reset: it closed with our data unread
            return True
        except TimeoutError:
            return False

    def close(self):
        self.s.close()


def same_transcripts(mine, theirs):
    """Fail unless two transcripts (lists of replies and states) are equal, printing
    each difference; $V prints ioplane's."""
    bad = 0
    if os.environ.get('V'):
        for a in mine:
            print(a)
    for a, b in zip(mine, theirs):
        if a != b:
            print('differs: ioplane %r\n         qsd     %r' % (a, b))
            bad += 1
    if bad or len(mine) != len(theirs):
        fail('%d replies differ from qemu-storage-daemon' % bad)
    print('PASS: %d replies and states as qemu-storage-daemon' % len(mine))


def free_port():
    """A TCP port on 127.0.0.1 that nobody listens on (for the moment)."""
    s = socket.socket()
    s.bind(('127.0.0.1', 0))
    port = s.getsockname()[1]
    s.close()
    return port


def wait_socket(path, proc):
    for _ in range(WAIT_S * 100):
        if proc.poll() is not None:
            fail('%s exited %d before listening' % (proc.args[0], proc.returncode))
        if os.path.exists(path):
            try:
                socket.socket(socket.AF_UNIX).connect(path)
                return
            except OSError:
                pass
        time.sleep(0.01)
    fail('no socket at %s after %d s' % (path, WAIT_S))


class Daemon:
    """kind 'ioplane' or 'qsd', with a QMP monitor at tmp/KIND.qmp given as qsd takes it:
    --chardev socket,id=m0,path=...,server=on,wait=off --monitor chardev=m0."""

    def __init__(self, kind, tmp, extra=()):
        self.kind = kind
        self.path = os.path.join(tmp, kind + '.qmp')
        mon = ['--chardev', 'socket,id=m0,path=%s,server=on,wait=off' % self.path,
               '--monitor', 'chardev=m0']
        argv = ([IOPLANE, 'serve', '-q'] if kind == 'ioplane' else [QSD]) + mon + list(extra)
        self.log_path = os.path.join(tmp, kind + '.log')
        self.log = open(self.log_path, 'w')
        self.proc = subprocess.Popen(argv, stdout=self.log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL)
        wait_socket(self.path, self.proc)

    def client(self):
        return Client(self.path)

    def rss_kib(self, field='VmRSS'):
        with open('/proc/%d/status' % self.proc.pid) as f:
            for line in f:
                if line.startswith(field + ':'):
                    return int(line.split()[1])
        return 0

    def wait(self):
        try:
            return self.proc.wait(timeout=WAIT_S * 3)
        except subprocess.TimeoutExpired:
            fail('%s still running %d s after quit' % (self.kind, WAIT_S * 3))

    def cleanup(self, ok):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=WAIT_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        with open(self.log_path) as f:
            log = f.read()
        if log and not ok:
            print('---- %s log\n%s' % (self.kind, log[-3000:]))
