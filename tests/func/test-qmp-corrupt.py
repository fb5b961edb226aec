"""BLOCK_IMAGE_CORRUPTED: a qcow2 image whose L2 entry points at its own L2 table (from
_qcow2craft.py) is served over NBD with a QMP monitor by qemu-storage-daemon and by
`ioplane serve`; qemu-io writes into that cluster; each monitor client must get the
event, with the same keys and types (less the offset and size qsd adds), device "",
the node's name and fatal true, and the write must fail."""
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _qmp  # noqa: E402

CRAFT = os.path.join(os.path.dirname(os.path.abspath(__file__)), '_qcow2craft.py')


def event(c, name):
    deadline = time.monotonic() + _qmp.WAIT_S
    while time.monotonic() < deadline:
        for e in c.events:
            if e['event'] == name:
                return e
        try:
            m = c.recv(max(deadline - time.monotonic(), 0.01))
        except TimeoutError:
            break
        if 'event' in m:
            c.events.append(m)
    _qmp.fail('no %s event' % name)


def run(kind, tmp):
    img = os.path.join(tmp, kind + '.qcow2')
    sock = os.path.join(tmp, kind + '.nbd')
    subprocess.run([sys.executable, CRAFT, 'data-on-l2', img], check=True)
    if kind == 'qsd':
        extra = ['--blockdev', 'driver=file,node-name=f,filename=' + img,
                 '--blockdev', 'driver=qcow2,node-name=q,file=f',
                 '--nbd-server', 'addr.type=unix,addr.path=' + sock,
                 '--export', 'nbd,id=e,node-name=q,name=d,writable=on']
    else:
        extra = ['--image', 'd,file=%s,format=qcow2' % img,
                 '--nbd', 'unix=%s,image=d,writable=on' % sock]
    d = _qmp.Daemon(kind, tmp, extra)
    ok = False
    try:
        c = d.client().negotiate()
        for _ in range(100):
            if os.path.exists(sock):
                break
            time.sleep(0.1)
        w = subprocess.run(['qemu-io', '-f', 'raw', '-c', 'write -P 0x77 0 4k',
                            'nbd+unix:///d?socket=' + sock], capture_output=True, text=True)
        if 'failed' not in w.stdout + w.stderr:
            _qmp.fail('%s: the write onto the L2 table did not fail: %s' % (kind, w.stdout))
        e = event(c, 'BLOCK_IMAGE_CORRUPTED')
        c.cmd('quit')
        d.wait()
        ok = True
        return e['data']
    finally:
        d.cleanup(ok)


def main():
    if not _qmp.QSD:
        _qmp.skip('qemu-storage-daemon is not installed')
    with tempfile.TemporaryDirectory() as tmp:
        q = run('qsd', tmp)
        i = run('ioplane', tmp)
    types = {k: type(v).__name__ for k, v in q.items() if k not in ('offset', 'size')}
    if {k: type(v).__name__ for k, v in i.items()} != types:
        _qmp.fail('event data differ: qsd %r, ioplane %r' % (q, i))
    if i['device'] != '' or not i['fatal'] or not i['node-name'] or 'L2 table' not in i['msg']:
        _qmp.fail('event data: %r' % i)
    print('ok: BLOCK_IMAGE_CORRUPTED as qemu-storage-daemon sends it: %r' % i)


main()
