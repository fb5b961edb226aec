#!/usr/bin/env python3
"""Exports and iothreads at runtime over QMP, the same script against
qemu-storage-daemon and `ioplane serve`:

1. object-add / object-del of iothreads, nbd-server-start / -stop,
   block-export-add (nbd, vhost-user-blk) / -del (safe and hard, with a client
   connected), query-block-exports: every reply has the same class and text (errors)
   or the same keys and types (returns), except the steps marked as ioplane's
   documented differences; the effect is the same (qemu-io reads the export's data
   after the add, cannot connect after the del; a client using an export removed with
   mode=hard is disconnected), and BLOCK_EXPORT_DELETED arrives for every removal.
2. ioplane only: query-iothreads (qsd 7.2 has no such command) with QEMU's members
   and the threads' real ids; object-del of an iothread an export runs on fails until
   the export is gone; iothreads=[...]; two monitor clients both get the events;
   --object / --nbd-server / --export on the command line build what QMP builds.

Exit 0 pass, 77 skip, 1 fail."""
import os
import socket
import struct
import subprocess
import sys
import tempfile
import time
import types

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _nbdproto import Closed as NbdClosed, Conn  # noqa: E402
from _qmp import IOPLANE, QSD, Client, Daemon, skip  # noqa: E402
from _qmp import fail as _fail  # noqa: E402


def fail(msg):
    _fail(msg if len(msg) < 2000 else msg[:2000] + '...')

PATTERN = 0x5a
SIZE = 4 << 20

# Steps where ioplane differs on purpose (docs/control.md): only the reply kind is
# compared, or nothing.
DIFFER = {
    'writethrough',       # ioplane refuses it; qsd takes it
    'lbs 1024',           # ioplane: 512 or 4096 only
    'num-queues 2000',    # qsd takes it; ioplane has at most 256
    'writethrough gone', 'lbs 1024 gone', 'num-queues 2000 gone',  # only in qsd
}


def shape(v):
    if isinstance(v, dict):
        return {k: shape(x) for k, x in sorted(v.items())}
    if isinstance(v, list):
        return [shape(x) for x in v[:1]]
    return type(v).__name__


def steps(tmp, kind):
    sock = os.path.join(tmp, kind + '-nbd.sock')
    vu = os.path.join(tmp, kind + '-vu.sock')
    nbd = {'type': 'nbd', 'node-name': 'n0'}
    vhost = {'type': 'vhost-user-blk', 'node-name': 'n0',
             'addr': {'type': 'unix', 'path': vu}}
    it = {'qom-type': 'iothread'}
    return [
        ('iothread', 'object-add', dict(it, id='io0')),
        ('iothread dup', 'object-add', dict(it, id='io0')),
        ('iothread poll', 'object-add', dict(it, id='io1', **{'poll-max-ns': 1000,
                                                          'poll-grow': 2, 'poll-shrink': 3})),
        ('iothread bad id', 'object-add', dict(it, id='1x')),
        ('iothread bogus', 'object-add', dict(it, id='io2', bogus=1)),
        ('iothread negative', 'object-add', dict(it, id='io2', **{'poll-max-ns': -1})),
        ('bad qom-type', 'object-add', {'qom-type': 'nope', 'id': 'x'}),
        ('no id', 'object-add', it),
        ('object-del unknown', 'object-del', {'id': 'nope'}),
        ('export without server', 'block-export-add', dict(nbd, id='e0')),
        ('server', 'nbd-server-start', {'addr': {'type': 'unix', 'data': {'path': sock}}}),
        ('server again', 'nbd-server-start', {'addr': {'type': 'unix',
                                                       'data': {'path': sock + '2'}}}),
        ('unknown node', 'block-export-add', dict(nbd, id='e0', **{'node-name': 'nX'})),
        ('unknown iothread', 'block-export-add', dict(nbd, id='e0', iothread='nope')),
        ('bad export id', 'block-export-add', dict(nbd, id='0e')),
        ('read-only node writable', 'block-export-add',
         dict(nbd, id='e0', writable=True, **{'node-name': 'ro'})),
        ('long name', 'block-export-add', dict(nbd, id='e0', name='x' * 4097)),
        ('bitmap', 'block-export-add', dict(nbd, id='e0', bitmaps=['b'])),
        ('writethrough', 'block-export-add', dict(nbd, id='ew', name='wt', writethrough=True)),
        ('writethrough gone', 'block-export-del', {'id': 'ew'}),
        # Not iothread=: qsd 7.2 then aborts when the client disconnects (an
        # assertion in nbd_blockdev_client_closed); ioplane_only() checks that case.
        ('nbd export', 'block-export-add', dict(nbd, id='e0', name='exp0',
                                                description='the first')),
        ('dup id', 'block-export-add', dict(nbd, id='e0')),
        ('dup name', 'block-export-add', dict(nbd, id='e1', name='exp0')),
        ('nbd export 2', 'block-export-add', dict(nbd, id='e1', writable=True)),
        ('vhost inet', 'block-export-add', dict(vhost, id='v0', addr={
            'type': 'inet', 'host': '127.0.0.1', 'port': '0'})),
        ('num-queues 0', 'block-export-add', dict(vhost, id='v0', **{'num-queues': 0})),
        ('lbs 1000', 'block-export-add', dict(vhost, id='v0', **{'logical-block-size': 1000})),
        ('lbs 1024', 'block-export-add', dict(vhost, id='vl', addr={
            'type': 'unix', 'path': vu + 'l'}, **{'logical-block-size': 1024})),
        ('lbs 1024 gone', 'block-export-del', {'id': 'vl'}),
        ('num-queues 2000', 'block-export-add', dict(vhost, id='vq', addr={
            'type': 'unix', 'path': vu + 'q'}, **{'num-queues': 2000})),
        ('num-queues 2000 gone', 'block-export-del', {'id': 'vq'}),
        ('vhost export', 'block-export-add', dict(vhost, id='v0', writable=True,
                                                  iothread='io1', **{'num-queues': 2})),
        ('query', 'query-block-exports', None),
        ('del unknown', 'block-export-del', {'id': 'nope'}),
        ('del bad mode', 'block-export-del', {'id': 'e0', 'mode': 'soft'}),
        # here a client connects to e1 (see run())
        ('del in use', 'block-export-del', {'id': 'e1'}),
        ('del in use safe', 'block-export-del', {'id': 'e1', 'mode': 'safe'}),
        ('del hard', 'block-export-del', {'id': 'e1', 'mode': 'hard'}),
        ('del e0', 'block-export-del', {'id': 'e0'}),
        ('query after del', 'query-block-exports', None),
        ('server stop', 'nbd-server-stop', None),
        ('server stop again', 'nbd-server-stop', None),
        ('del v0', 'block-export-del', {'id': 'v0'}),
        ('query empty', 'query-block-exports', None),
        ('object-del io0', 'object-del', {'id': 'io0'}),
        ('object-del io1', 'object-del', {'id': 'io1'}),
    ]


def nbd_uri(tmp, kind, name):
    return 'nbd+unix:///%s?socket=%s' % (name, os.path.join(tmp, kind + '-nbd.sock'))


def qemu_io(uri, cmd):
    return subprocess.run(['qemu-io', '-r', '-f', 'raw', '-c', cmd, uri], capture_output=True,
                          text=True, timeout=30, stdin=subprocess.DEVNULL)


def wait_event(c, eid):
    if not c.wait_event('BLOCK_EXPORT_DELETED', {'id': eid}):
        fail('no BLOCK_EXPORT_DELETED for %s (got %r)' % (eid, c.events))


def effects_after(tmp, kind, what, c, held):
    """What each step must have done, checked with real clients."""
    if what == 'nbd export':
        r = qemu_io(nbd_uri(tmp, kind, 'exp0'), 'read -P 0x%x 0 64k' % PATTERN)
        if r.returncode or 'read 65536/65536' not in r.stdout:
            fail('%s: qemu-io cannot read exp0: %s %s' % (kind, r.stdout, r.stderr))
    elif what == 'del bad mode':
        held['conn'] = Conn(types.SimpleNamespace(
            socket=os.path.join(tmp, kind + '-nbd.sock'), timeout=10))
        held['conn'].handshake()
        held['conn'].go('n0')
    elif what == 'del hard':
        wait_event(c, 'e1')
        try:
            held['conn'].read(0, 512)
            fail('%s: a client of an export deleted with mode=hard can still read' % kind)
        except NbdClosed:
            pass
    elif what == 'del e0':
        wait_event(c, 'e0')
        if qemu_io(nbd_uri(tmp, kind, 'exp0'), 'read 0 512').returncode == 0:
            fail('%s: exp0 still served after block-export-del' % kind)
    elif what == 'del v0':
        wait_event(c, 'v0')
        if os.path.exists(os.path.join(tmp, kind + '-vu.sock')):
            fail('%s: the vhost-user socket is still there after block-export-del' % kind)


def run(tmp, kind, img, ro):
    if kind == 'qsd':
        extra = ['--blockdev', 'driver=file,filename=%s,node-name=n0' % img,
                 '--blockdev', 'driver=file,filename=%s,node-name=ro,read-only=on' % ro]
    else:
        extra = ['--image', 'n0,file=%s,format=raw' % img,
                 '--image', 'ro,file=%s,format=raw,read-only=on' % ro]
    d = Daemon(kind, tmp, extra)
    replies, held = {}, {}
    try:
        c = d.client().negotiate()
        for what, cmd, args in steps(tmp, kind):
            replies[what] = c.cmd(cmd, args)
            if os.environ.get('V'):
                print(kind, what, replies[what], flush=True)
            effects_after(tmp, kind, what, c, held)
        if kind == 'ioplane':
            ioplane_only(d, c, tmp)
        c.cmd('quit')
        d.wait()
        ok = True
    finally:
        d.cleanup(locals().get('ok', False))
    return replies


def compare(q, i):
    for what in q:
        a, b = q[what], i[what]
        if what in DIFFER:
            continue
        if ('error' in a) != ('error' in b):
            fail('%s: qsd %r, ioplane %r' % (what, a, b))
        if 'error' in a:
            if what == 'long name':  # ioplane cuts quoted input at 1 KiB (docs/control.md)
                a['error']['desc'] = a['error']['desc'][:900]
                b['error']['desc'] = b['error']['desc'][:900]
            if a['error'] != b['error']:
                fail('%s: qsd %r, ioplane %r' % (what, a['error'], b['error']))
            continue
        ra, rb = a['return'], b['return']
        if isinstance(ra, list):
            ra, rb = sorted(ra, key=lambda e: e['id']), sorted(rb, key=lambda e: e['id'])
            if [e['id'] for e in ra] != [e['id'] for e in rb]:
                fail('%s: qsd %r, ioplane %r' % (what, ra, rb))
            if ra != rb:
                fail('%s: qsd %r, ioplane %r' % (what, ra, rb))
        if shape(ra) != shape(rb):
            fail('%s: qsd %r, ioplane %r' % (what, ra, rb))


def ioplane_only(d, c, tmp):
    c2 = d.client().negotiate()
    r = c.cmd('object-add', {'qom-type': 'iothread', 'id': 'a', 'poll-max-ns': 0})
    r2 = c.cmd('object-add', {'qom-type': 'iothread', 'id': 'b', 'aio-max-batch': 7})
    if r != {'return': {}} or r2 != {'return': {}}:
        fail('object-add: %r %r' % (r, r2))
    threads = {t['id']: t for t in c.cmd('query-iothreads')['return']}
    a, b = threads.get('a'), threads.get('b')
    if not a or not b or set(a) != {'id', 'thread-id', 'poll-max-ns', 'poll-grow',
                                    'poll-shrink', 'aio-max-batch', 'x-ioplane'}:
        fail('query-iothreads: %r' % threads)
    if set(a['x-ioplane']) != {'rounds', 'sleeps', 'poll-hits', 'poll-misses', 'poll-ns',
                               'busy-ns'}:
        fail('query-iothreads: %r' % threads)
    if a['poll-max-ns'] != 0 or b['aio-max-batch'] != 7 or b['poll-max-ns'] != 32768:
        fail('query-iothreads values: %r' % threads)
    for t in (a, b):
        if not os.path.exists('/proc/%d/task/%d' % (d.proc.pid, t['thread-id'])):
            fail('query-iothreads: %r is not a thread of the daemon' % t)
    vu = os.path.join(tmp, 'spread.sock')
    r = c.cmd('block-export-add', {'type': 'vhost-user-blk', 'id': 'spread', 'node-name': 'n0',
                                   'addr': {'type': 'unix', 'path': vu}, 'num-queues': 4,
                                   'iothreads': ['a', 'b']})
    if r != {'return': {}}:
        fail('iothreads=[a, b]: %r' % r)
    r = c.cmd('block-export-add', {'type': 'vhost-user-blk', 'id': 'x', 'node-name': 'n0',
                                   'addr': {'type': 'unix', 'path': vu + 'x'},
                                   'iothreads': ['a', 'nope']})
    if r.get('error', {}).get('desc') != 'iothread "nope" not found':
        fail('iothreads with an unknown one: %r' % r)
    r = c.cmd('object-del', {'id': 'b'})
    if r.get('error', {}).get('desc') != "object 'b' is in use, can not be deleted":
        fail('object-del of an iothread in use: %r' % r)
    r = c.cmd('nbd-server-start', {'addr': {'type': 'unix', 'data': {
        'path': os.path.join(tmp, 'io.sock')}}})
    r2 = c.cmd('block-export-add', {'type': 'nbd', 'id': 'nt', 'node-name': 'n0',
                                    'iothread': 'a'})
    if r != {'return': {}} or r2 != {'return': {}}:
        fail('NBD export with iothread=a: %r %r' % (r, r2))
    r = qemu_io('nbd+unix:///n0?socket=%s' % os.path.join(tmp, 'io.sock'),
                'read -P 0x%x 0 4k' % PATTERN)
    if r.returncode or 'read 4096/4096' not in r.stdout:
        fail('NBD export with iothread=a: qemu-io: %s %s' % (r.stdout, r.stderr))
    if c.cmd('query-version').get('return') is None:  # still up after the client left
        fail('the daemon is gone after a client of an iothread export left')
    c.cmd('nbd-server-stop')
    wait_event(c, 'nt')
    c.cmd('block-export-del', {'id': 'spread'})
    wait_event(c, 'spread')
    wait_event(c2, 'spread')  # every negotiated client gets the event
    for t in ('a', 'b'):
        r = c.cmd('object-del', {'id': t})
        if r != {'return': {}}:
            fail('object-del %s after its export went: %r' % (t, r))
    if any(t['id'] in ('a', 'b') for t in c.cmd('query-iothreads')['return']):
        fail('deleted iothreads still listed')
    c2.close()


def cmdline(tmp, img):
    """--object, --nbd-server, --export: what the QMP commands build."""
    sock = os.path.join(tmp, 'cl-nbd.sock')
    d = Daemon('ioplane', tmp, [
        '--image', 'n0,file=%s,format=raw' % img,
        '--object', 'iothread,id=t0,poll-max-ns=100',
        '--nbd-server', 'addr.type=unix,addr.path=%s' % sock,
        '--export', 'type=nbd,id=e0,node-name=n0,name=exp,,0,iothread=t0',
        '--export', '{"type": "vhost-user-blk", "id": "v0", "node-name": "n0", '
                    '"addr": {"type": "unix", "path": "%s"}}' % os.path.join(tmp, 'cl-vu.sock')])
    ok = False
    try:
        c = d.client().negotiate()
        ex = sorted(e['id'] for e in c.cmd('query-block-exports')['return'])
        if ex != ['e0', 'v0']:
            fail('--export: query-block-exports %r' % ex)
        t = [x for x in c.cmd('query-iothreads')['return'] if x['id'] == 't0']
        if not t or t[0]['poll-max-ns'] != 100:
            fail('--object: %r' % t)
        r = qemu_io('nbd+unix:///exp,0?socket=%s' % sock, 'read -P 0x%x 0 4k' % PATTERN)
        if r.returncode or 'read 4096/4096' not in r.stdout:
            fail('--export name with ",,": qemu-io: %s %s' % (r.stdout, r.stderr))
        c.cmd('quit')
        d.wait()
        ok = True
    finally:
        d.cleanup(ok)
    bad = subprocess.run([IOPLANE, 'serve', '--image', 'n0,file=%s' % img,
                          '--export', 'type=nbd,id=e0,node-name=n0'],
                         capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
    if bad.returncode != 1 or 'NBD server not running' not in bad.stderr:
        fail('--export without --nbd-server: %d %r' % (bad.returncode, bad.stderr))
    bad = subprocess.run([IOPLANE, 'serve', '--export', 'type=nbd,id=e0'], capture_output=True,
                         text=True, timeout=30, stdin=subprocess.DEVNULL)
    if bad.returncode != 2 or "Parameter 'node-name' is missing" not in bad.stderr:
        fail('--export without node-name: %d %r' % (bad.returncode, bad.stderr))


def fd_passing(tmp, img):
    """addr.type=fd: listening sockets from the parent, on the command line only."""
    ls = []
    for name in ('fd-nbd.sock', 'fd-vu.sock'):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.bind(os.path.join(tmp, name))
        s.listen(4)
        ls.append(s)
    mon = os.path.join(tmp, 'fd.qmp')
    p = subprocess.Popen([IOPLANE, 'serve', '-q', '--image', 'n0,file=%s,format=raw' % img,
                          '--nbd-server', 'addr.type=fd,addr.str=%d' % ls[0].fileno(),
                          '--export', 'type=nbd,id=e0,node-name=n0',
                          '--export', 'type=vhost-user-blk,id=v0,node-name=n0,addr.type=fd,'
                          'addr.str=%d' % ls[1].fileno(), '--monitor', 'unix=' + mon],
                         pass_fds=[s.fileno() for s in ls], stdin=subprocess.DEVNULL)
    ok = False
    try:
        for s in ls:
            s.close()
        for _ in range(1000):
            if os.path.exists(mon):
                break
            time.sleep(0.01)
        c = Client(mon).negotiate()
        r = qemu_io('nbd+unix:///n0?socket=%s' % os.path.join(tmp, 'fd-nbd.sock'),
                    'read -P 0x%x 0 4k' % PATTERN)
        if r.returncode or 'read 4096/4096' not in r.stdout:
            fail('--nbd-server addr.type=fd: qemu-io: %s %s' % (r.stdout, r.stderr))
        fe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        fe.settimeout(10)
        fe.connect(os.path.join(tmp, 'fd-vu.sock'))
        fe.sendall(struct.pack('<III', 1, 1, 0))  # GET_FEATURES
        if len(fe.recv(20, socket.MSG_WAITALL)) != 20:
            fail('--export vhost-user-blk addr.type=fd does not answer')
        fe.close()
        # Over QMP a number would name any fd of the daemon: refused, as qsd does.
        r = c.cmd('block-export-add', {'type': 'vhost-user-blk', 'id': 'v1', 'node-name': 'n0',
                                       'addr': {'type': 'fd', 'str': '3'}})
        if r.get('error', {}).get('desc') != 'only QEMU supports file descriptor passing':
            fail('block-export-add with addr.type=fd over QMP: %r' % r)
        c.cmd('quit')
        p.wait(timeout=30)
        ok = p.returncode == 0
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    if not ok:
        fail('the daemon with passed sockets exited %r' % p.returncode)


def main():
    if not QSD:
        skip('qemu-storage-daemon is not installed')
    for tool in ('qemu-io',):
        if not subprocess.run(['which', tool], capture_output=True).returncode == 0:
            skip('%s is not installed' % tool)
    with tempfile.TemporaryDirectory(prefix='ioplane-qmpexp.') as tmp:
        img, ro = os.path.join(tmp, 'd.img'), os.path.join(tmp, 'ro.img')
        for p in (img, ro):
            with open(p, 'wb') as f:
                f.write(bytes([PATTERN]) * SIZE)
        q = run(tmp, 'qsd', img, ro)
        i = run(tmp, 'ioplane', img, ro)
        compare(q, i)
        cmdline(tmp, img)
        fd_passing(tmp, img)
    print('ok: %d steps alike (%d documented differences)' % (len(q), len(DIFFER)))


if __name__ == '__main__':
    main()
