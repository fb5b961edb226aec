"""`ioplane serve` under a service manager, with systemd's protocols played by this test:

1. Readiness ($NOTIFY_SOCKET, a datagram socket here, by path and abstract): READY=1
   comes once, when every socket (NBD, vhost-user-blk, QMP, metrics) already accepts,
   with STATUS= and MAINPID=; STOPPING=1 comes on SIGTERM; exit 0.
2. Socket activation ($LISTEN_PID, $LISTEN_FDS, $LISTEN_FDNAMES): sockets bound here
   are served - NBD by path and a TCP one by name (its own port would fail), a
   vhost-user-blk export by id, a QMP monitor by path, the metrics by name - the daemon
   creates no socket file of its own and leaves the passed ones alone at exit; a
   socket that matches no server is logged and closed; LISTEN_PID of another process
   is ignored.
3. --log-file: SIGHUP after the file was renamed (logrotate) makes a new one, the
   daemon keeps serving; SIGUSR1 logs the statistics there.
4. As root: user=/group= give each unix socket to that owner; --run-with user=nobody
   drops to nobody's uid and gid once listening, and the exports still serve."""
import os
import pwd
import grp
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _qmp  # noqa: E402

fail = _qmp.fail
IOPLANE = _qmp.IOPLANE
WAIT_S = 30


def notify_socket(tmp, abstract):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    if abstract:
        name = '@ioplane-test-%d-%d' % (os.getpid(), time.monotonic_ns())
        s.bind('\0' + name[1:])
    else:
        name = os.path.join(tmp, 'notify.sock')
        s.bind(name)
    s.settimeout(WAIT_S)
    return s, name


def recv_msg(s):
    try:
        return dict(l.split('=', 1) for l in s.recv(4096).decode().split('\n') if '=' in l)
    except socket.timeout:
        fail('no notification within %d s' % WAIT_S)


def connectable(path):
    c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        c.connect(path)
        return True
    except OSError:
        return False
    finally:
        c.close()


def args_for(tmp, extra=()):
    return ['--image', 'd,driver=null,size=16M,read-zeroes=on',
            '--nbd', 'unix=%s/nbd.sock,image=d,writable=on' % tmp,
            '--vhost-user-blk', 'unix=%s/vu.sock,image=d,id=vu' % tmp,
            '--monitor', 'unix=%s/qmp.sock' % tmp,
            '--metrics', 'unix=%s/metrics.sock' % tmp] + list(extra)


def reap(p):
    if p.poll() is None:
        p.kill()
        p.wait()


def vhost_probe(path, what):
    """A vhost-user GET_FEATURES round trip on path."""
    fe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    fe.settimeout(WAIT_S)
    fe.connect(path)
    fe.sendall(struct.pack('<III', 1, 1, 0))
    hdr = fe.recv(12, socket.MSG_WAITALL)
    fe.close()
    if len(hdr) != 12 or struct.unpack('<III', hdr)[0] != 1:
        fail('vhost-user on %s: %r' % (what, hdr))


def stop(p, log=None):
    if p.poll() is None:
        p.send_signal(signal.SIGTERM)
    try:
        rc = p.wait(timeout=WAIT_S)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()
        fail('still running %d s after SIGTERM' % WAIT_S)
    if rc != 0:
        fail('exit %d: %s' % (rc, open(log).read()[-2000:] if log else ''))


def readiness(tmp, abstract):
    ns, name = notify_socket(tmp, abstract)
    log = os.path.join(tmp, 'ready.log')
    p = subprocess.Popen([IOPLANE, 'serve'] + args_for(tmp), stdin=subprocess.DEVNULL,
                         stdout=open(log, 'w'), stderr=subprocess.STDOUT,
                         env=dict(os.environ, NOTIFY_SOCKET=name))
    try:
        m = recv_msg(ns)
        socks = [os.path.join(tmp, n) for n in ('nbd.sock', 'vu.sock', 'qmp.sock', 'metrics.sock')]
        missing = [x for x in socks if not connectable(x)]
        if m.get('READY') != '1' or missing:
            fail('READY %r while %r do not accept' % (m, missing))
        if m.get('MAINPID') != str(p.pid) or 'serving 2 export(s)' not in m.get('STATUS', ''):
            fail('READY message: %r' % m)
        p.send_signal(signal.SIGTERM)
        m = recv_msg(ns)
        if m.get('STOPPING') != '1':
            fail('after SIGTERM: %r' % m)
        stop(p, log)
    finally:
        reap(p)
        ns.close()


def listener(path=None, tcp=False):
    if tcp:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.bind(('127.0.0.1', 0))
    else:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.bind(path)
    s.listen(16)
    return s


def spawn_activated(argv, socks, log, env=None):
    """argv with socks (listening sockets) passed as fds 3, 4, ... and LISTEN_PID its own."""
    fds = [x.fileno() for x in socks]

    def place():
        tmpfds = [os.dup(f) for f in fds]
        for i, f in enumerate(tmpfds):
            os.dup2(f, 3 + i)
            os.close(f)

    e = dict(os.environ, LISTEN_FDS=str(len(socks)), **(env or {}))
    return subprocess.Popen(['sh', '-c', 'LISTEN_PID=$$ exec "$0" "$@"'] + argv,
                            stdin=subprocess.DEVNULL, stdout=open(log, 'w'),
                            stderr=subprocess.STDOUT, preexec_fn=place, close_fds=False, env=e)


def activated(tmp):
    d = os.path.join(tmp, 'act')
    os.mkdir(d)
    socks = [('whatever', listener(os.path.join(d, 'nbd.sock'))),
             ('tcpexp', listener(tcp=True)),
             ('vu', listener(os.path.join(d, 'vu.sock'))),
             ('', listener(os.path.join(d, 'qmp.sock'))),
             ('metrics', listener(os.path.join(d, 'metrics.sock'))),
             ('stray', listener(os.path.join(d, 'stray.sock')))]
    port = socks[1][1].getsockname()[1]
    inodes = {n: os.stat(os.path.join(d, n)).st_ino
              for n in ('nbd.sock', 'vu.sock', 'qmp.sock', 'metrics.sock')}
    names = ':'.join(n for n, _ in socks)
    log = os.path.join(tmp, 'act.log')
    ns, nname = notify_socket(tmp, True)
    p = spawn_activated([IOPLANE, 'serve'] + args_for(d, [
        '--nbd', 'tcp=127.0.0.1:1,image=d,name=t,id=tcpexp']), [x for _, x in socks], log,
        {'LISTEN_FDNAMES': names, 'NOTIFY_SOCKET': nname})
    for _, s in socks:
        s.close()  # the daemon has them
    try:
        if recv_msg(ns).get('READY') != '1':
            fail('not ready')
        r = subprocess.run(['qemu-io', '-f', 'raw', '-c', 'write 0 4k',
                            'nbd+unix:///d?socket=%s/nbd.sock' % d], capture_output=True,
                           timeout=60)
        r2 = subprocess.run(['qemu-io', '-f', 'raw', '-r', '-c', 'read 0 4k',
                             'nbd://127.0.0.1:%d/t' % port], capture_output=True, timeout=60)
        if r.returncode or r2.returncode or b'error' in r2.stdout + r.stdout:
            fail('NBD on passed sockets: %r %r' % (r.stdout + r.stderr, r2.stdout + r2.stderr))
        c = _qmp.Client(os.path.join(d, 'qmp.sock')).negotiate()
        ex = {e['id'] for e in c.cmd('query-block-exports')['return']}
        if ex != {'d', 'vu', 'tcpexp'}:
            fail('exports %r' % ex)
        c.close()
        vhost_probe(os.path.join(d, 'vu.sock'), 'the passed socket')
        m = socket.socket(socket.AF_UNIX)
        m.settimeout(WAIT_S)
        m.connect(os.path.join(d, 'metrics.sock'))
        m.sendall(b'GET /metrics HTTP/1.1\r\n\r\n')
        if not m.recv(20).startswith(b'HTTP/1.1 200'):
            fail('metrics on the passed socket')
        m.close()
        for n, ino in inodes.items():
            if os.stat(os.path.join(d, n)).st_ino != ino:
                fail('%s was replaced by the daemon' % n)
        stop(p, log)
    finally:
        reap(p)
        ns.close()
    text = open(log).read()
    if 'stray' not in text or 'matches no server' not in text:
        fail('the stray socket was not reported:\n' + text)
    for n in inodes:  # systemd's, not ours: left in place
        if not os.path.exists(os.path.join(d, n)):
            fail('%s removed at exit' % n)
    # LISTEN_PID of another process: nothing is taken, the daemon binds itself.
    d2 = os.path.join(tmp, 'other')
    os.mkdir(d2)
    p = subprocess.Popen([IOPLANE, 'serve'] + args_for(d2), stdin=subprocess.DEVNULL,
                         stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
                         env=dict(os.environ, LISTEN_PID='1', LISTEN_FDS='1'))
    _qmp.wait_socket(os.path.join(d2, 'qmp.sock'), p)
    stop(p)


def activated_qsd(tmp):
    """qemu-storage-daemon's options: --nbd-server and --export addr.type=unix take the
    passed socket bound to their path."""
    d = os.path.join(tmp, 'qsd')
    os.mkdir(d)
    nbd, vu = os.path.join(d, 'nbd.sock'), os.path.join(d, 'vu.sock')
    socks = [listener(vu), listener(nbd)]
    ino = (os.stat(nbd).st_ino, os.stat(vu).st_ino)
    log = os.path.join(tmp, 'qsd-act.log')
    p = spawn_activated([IOPLANE, 'serve', '--blockdev', 'driver=null-co,node-name=n1',
                         '--nbd-server', 'addr.type=unix,addr.path=' + nbd,
                         '--export', 'type=nbd,id=e1,node-name=n1,name=n1',
                         '--export', 'type=vhost-user-blk,id=v1,node-name=n1,addr.type=unix,'
                         'addr.path=' + vu], socks, log)
    for x in socks:
        x.close()
    try:
        r = None
        for _ in range(WAIT_S * 10):
            r = subprocess.run(['nbdinfo', '--size', 'nbd+unix:///n1?socket=' + nbd],
                               capture_output=True, timeout=30)
            if r.returncode == 0 or p.poll() is not None:
                break
            time.sleep(0.1)
        if r.returncode:
            fail('--nbd-server on the passed socket: %r\n%s' % (r.stderr, open(log).read()))
        vhost_probe(vu, '--export vhost-user-blk on the passed socket')
        if (os.stat(nbd).st_ino, os.stat(vu).st_ino) != ino:
            fail('the passed sockets were replaced')
        stop(p, log)
    finally:
        reap(p)
    if 'matches no server' in open(log).read():
        fail('a passed socket was not taken:\n' + open(log).read())


def log_file(tmp):
    logf = os.path.join(tmp, 'serve.log')
    nsock = os.path.join(tmp, 'lf-nbd.sock')
    p = subprocess.Popen([IOPLANE, 'serve', '--log-file', logf, '--image',
                          'd,driver=null,size=16M', '--nbd', 'unix=%s,image=d,writable=on' % nsock],
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
    try:
        _qmp.wait_socket(nsock, p)
        r = subprocess.run(['qemu-io', '-f', 'raw', '-c', 'write 0 8k', '-c', 'write 8k 8k',
                            'nbd+unix:///d?socket=' + nsock], capture_output=True, timeout=60)
        if r.returncode:
            fail('qemu-io: %r' % r.stderr)
        os.rename(logf, logf + '.1')
        p.send_signal(signal.SIGHUP)
        p.send_signal(signal.SIGUSR1)
        deadline = time.monotonic() + WAIT_S
        text = ''
        while time.monotonic() < deadline:
            text = open(logf).read() if os.path.exists(logf) else ''
            if 'stats: node d:' in text:
                break
            time.sleep(0.05)
        if 'reopened' not in text or 'write 2 ops 16384 bytes' not in text:
            fail('new log file: %r' % text)
        if 'listening on' not in open(logf + '.1').read():
            fail('the old log lost its lines')
        if p.poll() is not None:
            fail('SIGHUP killed the daemon')
        stop(p)
    finally:
        reap(p)


def as_root(tmp):
    if os.geteuid() != 0:
        return 'not root: user=/group= and --run-with not tested'
    try:
        nobody = pwd.getpwnam('nobody')
        nogroup = grp.getgrnam('nogroup')
    except KeyError:
        return 'no nobody/nogroup'
    d = os.path.join(tmp, 'own')
    os.mkdir(d)
    os.chmod(tmp, 0o755)
    os.chmod(d, 0o755)
    own = ',user=nobody,group=nogroup'
    argv = [IOPLANE, 'serve', '--run-with', 'user=nobody',
            '--image', 'd,driver=null,size=16M,read-zeroes=on',
            '--nbd', 'unix=%s/nbd.sock,image=d%s' % (d, own),
            '--vhost-user-blk', 'unix=%s/vu.sock,image=d,mode=0660%s' % (d, own),
            '--monitor', 'unix=%s/qmp.sock,group=nogroup' % d,
            '--metrics', 'unix=%s/metrics.sock%s' % (d, own)]
    ns, nname = notify_socket(tmp, True)
    log = os.path.join(tmp, 'root.log')
    p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=open(log, 'w'),
                         stderr=subprocess.STDOUT, env=dict(os.environ, NOTIFY_SOCKET=nname))
    try:
        if recv_msg(ns).get('READY') != '1':
            fail('not ready')
        want = {'nbd.sock': (nobody.pw_uid, nogroup.gr_gid, 0o600),
                'vu.sock': (nobody.pw_uid, nogroup.gr_gid, 0o660),
                'qmp.sock': (0, nogroup.gr_gid, 0o600),
                'metrics.sock': (nobody.pw_uid, nogroup.gr_gid, 0o600)}
        for n, (uid, gid, mode) in want.items():
            st = os.stat(os.path.join(d, n))
            if (st.st_uid, st.st_gid, st.st_mode & 0o777) != (uid, gid, mode):
                fail('%s: %d:%d %o, expected %d:%d %o' % (n, st.st_uid, st.st_gid,
                                                       st.st_mode & 0o777, uid, gid, mode))
        tasks = os.listdir('/proc/%d/task' % p.pid)
        for t in tasks:  # every thread: the iothreads too
            with open('/proc/%d/task/%s/status' % (p.pid, t)) as f:
                ids = {l.split(':')[0]: l.split()[1:] for l in f if l[:4] in ('Uid:', 'Gid:')}
            if ids['Uid'] != [str(nobody.pw_uid)] * 4 or ids['Gid'] != [str(nobody.pw_gid)] * 4:
                fail('--run-with user=nobody: thread %s: %r' % (t, ids))
        if len(tasks) < 2:
            fail('no iothreads? %r' % tasks)
        r = subprocess.run(['qemu-io', '-f', 'raw', '-r', '-c', 'read 0 4k',
                            'nbd+unix:///d?socket=%s/nbd.sock' % d], capture_output=True,
                           timeout=60)
        if r.returncode or b'error' in r.stdout:
            fail('serving as nobody: %r' % (r.stdout + r.stderr))
        stop(p, log)
    finally:
        reap(p)
        ns.close()
    r = subprocess.run([IOPLANE, 'serve', '--image', 'd,driver=null,size=1M', '--nbd',
                        'unix=%s/x.sock,image=d,user=no-such-user-here' % d],
                       capture_output=True, timeout=30)
    if r.returncode != 1 or b'no such user' not in r.stderr:
        fail('unknown user=: %d %r' % (r.returncode, r.stderr))
    return None


def main():
    if not shutil.which('qemu-io'):
        _qmp.skip('qemu-io is not installed')
    with tempfile.TemporaryDirectory() as tmp:
        readiness(tmp, False)
        readiness(tmp, True)
        activated(tmp)
        activated_qsd(tmp)
        log_file(tmp)
        why = as_root(tmp)
    if why:
        _qmp.skip(why + '; the rest passed')
    print('ok')


main()
