#!/usr/bin/env python3
"""The same QMP script against qemu-storage-daemon and `ioplane serve`, both started with
qsd's --chardev socket,...,server=on,wait=off --monitor chardev=m0:

1. Every reply to the commands both have (qmp_capabilities, query-version,
   query-commands, query-qmp-schema, quit) has the same keys and JSON types; every
   error for bad input (before negotiation, unknown command, missing / unknown /
   mistyped argument, bad request shapes, broken JSON, a control character, nesting
   too deep) has the same class and description ("JSON parse error, ..." texts come
   from different parsers: only that prefix is compared). ids come back unchanged.
   query-qmp-schema describes the common commands with the same arguments.
2. ioplane only (qsd serves one client per chardev, sends no SHUTDOWN, and reads a
   100 MiB message into memory): several clients at once, 50 commands in one write
   answered in order, a 100 MiB message refused with the connection closed and RSS
   growing by less than 32 MiB while another client is served, the rest of a
   too-deep message skipped, and SHUTDOWN (host-qmp-quit on quit, host-signal on
   SIGTERM) at every negotiated client, none at one that did not negotiate.

Exit 0 pass, 77 skip, 1 fail (scripts/test.sh conventions)."""
import json
import os
import signal
import socket
import sys
import tempfile
import threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _qmp import QSD, WAIT_S, Client, Closed, Daemon, fail, skip  # noqa: E402

PARSE = 'JSON parse error, '

# Before qmp_capabilities: (what, bytes sent). Each gets exactly one reply.
PRE = [
    ('command before negotiation', b'{"execute":"query-version"}'),
    ('unknown command before negotiation', b'{"execute":"nope","id":1}'),
    ('bad capability', b'{"execute":"qmp_capabilities","arguments":{"enable":["foo"]}}'),
    ('capabilities not a list', b'{"execute":"qmp_capabilities","arguments":{"enable":"oob"}}'),
    ('unknown argument', b'{"execute":"qmp_capabilities","arguments":{"bogus":1}}'),
    ('negotiation', b'{"execute":"qmp_capabilities","id":"neg"}'),
]

# In command mode.
CMD = [
    ('query-version', b'{"execute":"query-version","id":1}'),
    ('unknown command', b'{"execute":"nope"}'),
    ('unexpected argument', b'{"execute":"query-version","arguments":{"a":1}}'),
    ('negotiation again', b'{"execute":"qmp_capabilities"}'),
    ('mistyped argument', b'{"execute":"qmp_capabilities","arguments":{"enable":null}}'),
    ('mistyped list element', b'{"execute":"qmp_capabilities","arguments":{"enable":[1]}}'),
    ('unexpected request member', b'{"foo":1}'),
    ('request not an object', b'[]'),
    ('execute not a string', b'{"execute":1}'),
    ('arguments not an object', b'{"execute":"query-version","arguments":[]}'),
    ('unexpected member with id', b'{"execute":"query-version","id":1,"control":{}}'),
    ('no execute', b'{}'),
    ('exec-oob without oob', b'{"exec-oob":"query-version"}'),
    ('trailing comma', b'{"execute":"query-version",}'),
    ('bad keyword', b'{"a":tru}'),
    ('duplicate key', b'{"execute":"query-version","execute":"x"}'),
    ('single quotes', b'{\'execute\':\'query-version\',\'id\':\'a"b\'}'),
    ('control character', b'{"execute": \x01'),
    ('unicode escape, nested id', b'{"execute":"query-\\u0076ersion","id":{"n":[1,2,{"x":null}]}}'),
    ('top-level string', b'"abc" '),
    ('query-commands', b'{"execute":"query-commands"}'),
]


def shape(v):
    """v's keys and JSON types, not its values; a list as the set of its elements' shapes."""
    if isinstance(v, dict):
        return {k: shape(x) for k, x in v.items()}
    if isinstance(v, list):
        return sorted({json.dumps(shape(x), sort_keys=True) for x in v})
    return type(v).__name__


def compare(what, a, b):
    """a from qsd, b from ioplane."""
    if sorted(a) != sorted(b):
        fail('%s: qsd replied %r, ioplane %r' % (what, a, b))
    if a.get('id') != b.get('id'):
        fail('%s: ids differ: %r / %r' % (what, a.get('id'), b.get('id')))
    if 'return' in a:
        if shape(a['return']) != shape(b['return']):
            fail('%s: return shapes differ:\n qsd     %r\n ioplane %r' % (what, a, b))
        return
    ea, eb = a['error'], b['error']
    if ea['class'] != eb['class']:
        fail('%s: error class %s (qsd) / %s (ioplane)' % (what, ea['class'], eb['class']))
    if ea['desc'].startswith(PARSE) and eb['desc'].startswith(PARSE):
        return
    if ea['desc'] != eb['desc']:
        fail('%s: qsd says %r, ioplane %r' % (what, ea['desc'], eb['desc']))


def script(d):
    """Run PRE and CMD on one connection; the replies."""
    c = d.client()
    replies = {'greeting': c.greeting}
    for what, data in PRE + CMD:
        c.send(data)
        replies[what] = c.reply()
    c.send(b'{"execute":"query-qmp-schema"}')
    replies['schema'] = c.reply()['return']
    c.close()
    # Too deep: qsd then reads the tail as new messages (one error each); only the
    # first reply is compared.
    c = d.client().negotiate()
    c.send(b'{"execute":"x","id":' + b'[' * 1100 + b']' * 1100 + b'}')
    replies['too deep'] = c.reply()
    c.close()
    return replies


def commands(replies):
    return {e['name'] for e in replies['query-commands']['return']}


# Optional argument members ioplane has beyond qsd (docs/control.md).
EXTENSIONS = {'iothreads'}


def check_schema(qsd, io, common):
    """The common commands' SchemaInfo in both: same keys, same argument members."""
    for schema in (qsd, io):
        names = {e['name'] for e in schema}
        for e in schema:
            for key in ('arg-type', 'ret-type', 'element-type'):
                if key in e and e[key] not in names:
                    fail('schema: %s names an undescribed type %s' % (e['name'], e[key]))
    by_q = {e['name']: e for e in qsd}
    by_i = {e['name']: e for e in io}
    for name in common:
        q, i = by_q[name], by_i[name]
        if sorted(q) != sorted(i) or q['meta-type'] != 'command':
            fail('schema: %s: qsd %r, ioplane %r' % (name, q, i))
        qa, ia = by_q[q['arg-type']], by_i[i['arg-type']]
        # ioplane's documented extensions are optional members qsd lacks.
        ia_members = [m for m in ia['members']
                      if not (m['name'] in EXTENSIONS and 'default' in m)]
        if [(m['name'], 'default' in m) for m in qa['members']] != \
           [(m['name'], 'default' in m) for m in ia_members]:
            fail('schema: %s arguments: qsd %r, ioplane %r' % (name, qa, ia))
    # ioplane marks the features qsd marks: no other key may be new.
    extra = {k for e in io for k in e} - {k for e in qsd for k in e}
    if extra:
        fail('schema: SchemaInfo keys qsd does not use: %s' % sorted(extra))


def compare_all(tmp):
    replies = {}
    for kind in ('qsd', 'ioplane'):
        d = Daemon(kind, tmp)
        try:
            replies[kind] = script(d)
            c = d.client().negotiate()
            replies[kind]['quit'] = c.cmd('quit', id='bye')
            if not c.closed():
                fail('%s: the connection stays open after quit' % kind)
            rc = d.wait()
            if rc != 0:
                fail('%s exited %d after quit' % (kind, rc))
            replies[kind]['quit events'] = [e['event'] for e in c.events]
        finally:
            d.cleanup(False)
    q, i = replies['qsd'], replies['ioplane']
    g_q, g_i = q.pop('greeting'), i.pop('greeting')
    if shape(g_q['QMP']['version']) != shape(g_i['QMP']['version']):
        fail('greeting: qsd %r, ioplane %r' % (g_q, g_i))
    if i['query-version']['return']['qemu'] != {'major': 7, 'minor': 2, 'micro': 0}:
        fail('ioplane reports %r' % i['query-version'])
    if not i['query-version']['return']['package'].startswith('ioplane '):
        fail('ioplane package %r' % i['query-version'])
    common = commands(q) & commands(i)
    want = {'qmp_capabilities', 'query-version', 'query-commands', 'query-qmp-schema', 'quit'}
    if not want <= common:
        fail('commands both should have: %s' % sorted(want - common))
    check_schema(q.pop('schema'), i.pop('schema'), common)
    # qsd 7.2 sends no SHUTDOWN; ioplane sends QEMU's (see part 2).
    q.pop('quit events'), i.pop('quit events')
    for what in q:
        compare(what, q[what], i[what])
    print('ok: %d exchanges alike, %d common commands' % (len(q), len(common)))


def many_clients(tmp):
    d = Daemon('ioplane', tmp)
    ok = False
    try:
        cs = [d.client().negotiate() for _ in range(4)]
        lazy = d.client()  # never negotiates: gets no events
        for n, c in enumerate(cs):
            c.send(''.join(json.dumps({'execute': 'query-version', 'id': [n, k]})
                           for k in range(50)))
        for n, c in enumerate(cs):
            for k in range(50):
                r = c.reply()
                if r.get('id') != [n, k] or 'return' not in r:
                    fail('client %d reply %d: %r' % (n, k, r))
        r = cs[0].cmd('quit')
        if r != {'return': {}}:
            fail('quit: %r' % r)
        for n, c in enumerate(cs):
            if not c.closed():
                fail('client %d still connected after quit' % n)
            ev = [e for e in c.events if e['event'] == 'SHUTDOWN']
            if len(ev) != 1 or ev[0]['data'] != {'guest': False, 'reason': 'host-qmp-quit'} \
               or set(ev[0]['timestamp']) != {'seconds', 'microseconds'}:
                fail('client %d events: %r' % (n, c.events))
        if not lazy.closed() or lazy.events:
            fail('the client that did not negotiate got %r' % lazy.events)
        if d.wait() != 0:
            fail('ioplane exited %d after quit' % d.proc.returncode)
        ok = True
    finally:
        d.cleanup(ok)
    print('ok: 5 clients, 200 pipelined commands, SHUTDOWN to the negotiated ones')


def big_and_deep(tmp):
    d = Daemon('ioplane', tmp)
    ok = False
    try:
        other = d.client().negotiate()
        c = d.client().negotiate()
        before = d.rss_kib()
        # The rest of a message too deep is skipped: the next command is answered.
        c.send(b'[' * 5000 + b'"]]]"' + b']' * 5000 + b'{"execute":"query-version","id":2}')
        r = c.reply()
        if r.get('error', {}).get('desc') != 'JSON nesting depth limit exceeded':
            fail('too deep: %r' % r)
        if c.reply().get('id') != 2:
            fail('the command after a too-deep message was not answered')
        sent = [0]

        def push():
            chunk = b'x' * (1 << 20)
            try:
                c.s.sendall(b'{"execute":"query-version","id":"')
                for _ in range(100):
                    c.s.sendall(chunk)
                    sent[0] += len(chunk)
            except OSError:
                pass
        t = threading.Thread(target=push)
        t.start()
        t.join(WAIT_S * 3)
        if t.is_alive():
            fail('ioplane neither read nor refused a 100 MiB message')
        r = c.reply()
        if r.get('error') != {'class': 'GenericError', 'desc': 'JSON token size limit exceeded'}:
            fail('100 MiB message: %r' % r)
        if not c.closed():
            fail('the connection stays open after a 100 MiB message')
        grown = d.rss_kib('VmHWM') - before
        if grown > 32 << 10:
            fail('RSS grew by %d KiB for a refused message' % grown)
        if other.cmd('query-version', id='other').get('id') != 'other':
            fail('the other client is not served')
        d.proc.send_signal(signal.SIGTERM)
        if not other.closed():
            fail('still connected after SIGTERM')
        if [e['data'] for e in other.events] != [{'guest': False, 'reason': 'host-signal'}]:
            fail('events after SIGTERM: %r' % other.events)
        if d.wait() != 0:
            fail('ioplane exited %d after SIGTERM' % d.proc.returncode)
        ok = True
        print('ok: 100 MiB message refused after %d MiB sent, RSS +%d KiB; too deep skipped'
              % (sent[0] >> 20, grown))
    finally:
        d.cleanup(ok)


def main():
    if not QSD:
        skip('qemu-storage-daemon is not installed')
    with tempfile.TemporaryDirectory() as tmp:
        compare_all(tmp)
        many_clients(tmp)
        big_and_deep(tmp)


if __name__ == '__main__':
    try:
        main()
    except (Closed, TimeoutError, socket.timeout, ConnectionError) as e:
        fail('%s: %s' % (type(e).__name__, e))
