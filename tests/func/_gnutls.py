"""A TLS client session on libgnutls.so.30 through ctypes, for tests that need what
Python's ssl module cannot do: TLS 1.3 KeyUpdate (gnutls_session_key_update), a TLS 1.2
renegotiation, alerts of our choosing, and a count of the KeyUpdates the peer sent.
The leading underscore keeps the test runner (scripts/test.sh) from running it as a test.
The socket is made blocking, each wait bounded (SO_RCVTIMEO); one thread per session.
"""

import ctypes
import socket
import struct
import time

E_AGAIN, E_INTERRUPTED, E_WARNING_ALERT_RECEIVED = -28, -52, -16
E_FATAL_ALERT_RECEIVED, E_INVALID_SESSION, E_PREMATURE_TERMINATION = -12, -10, -110
E_REHANDSHAKE = -37
CLIENT, CRD_CERTIFICATE, X509_FMT_PEM = 2, 1, 1
KU_PEER = 1
HANDSHAKE_KEY_UPDATE, HOOK_POST = 24, 1
AL_WARNING, AL_FATAL = 1, 2
A_USER_CANCELED, A_NO_RENEGOTIATION = 90, 100
SHUT_RDWR, SHUT_WR = 0, 1
TLS1_2, TLS1_3 = 4, 5

HOOK = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_uint, ctypes.c_uint,
                        ctypes.c_uint, ctypes.c_void_p)


def load():
    """The library, or None when libgnutls30 is not installed."""
    try:
        g = ctypes.CDLL("libgnutls.so.30")
    except OSError:
        return None
    p, c_int, sz = ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t
    for name, res, args in (
            ("gnutls_certificate_allocate_credentials", c_int, [ctypes.POINTER(p)]),
            ("gnutls_certificate_set_x509_trust_file", c_int, [p, ctypes.c_char_p, c_int]),
            ("gnutls_certificate_set_x509_key_file", c_int,
             [p, ctypes.c_char_p, ctypes.c_char_p, c_int]),
            ("gnutls_certificate_free_credentials", None, [p]),
            ("gnutls_init", c_int, [ctypes.POINTER(p), ctypes.c_uint]),
            ("gnutls_deinit", None, [p]),
            ("gnutls_priority_set_direct", c_int, [p, ctypes.c_char_p, p]),
            ("gnutls_credentials_set", c_int, [p, c_int, p]),
            ("gnutls_transport_set_int2", None, [p, c_int, c_int]),
            ("gnutls_handshake", c_int, [p]),
            ("gnutls_record_send", ctypes.c_ssize_t, [p, p, sz]),
            ("gnutls_record_recv", ctypes.c_ssize_t, [p, p, sz]),
            ("gnutls_session_key_update", c_int, [p, ctypes.c_uint]),
            ("gnutls_alert_send", c_int, [p, c_int, c_int]),
            ("gnutls_alert_get", c_int, [p]),
            ("gnutls_bye", c_int, [p, c_int]),
            ("gnutls_protocol_get_version", c_int, [p]),
            ("gnutls_error_is_fatal", c_int, [c_int]),
            ("gnutls_strerror", ctypes.c_char_p, [c_int]),
            ("gnutls_handshake_set_hook_function", None, [p, ctypes.c_uint, c_int, HOOK])):
        f = getattr(g, name)
        f.restype, f.argtypes = res, args
    return g


class TlsError(Exception):
    def __init__(self, what, code, g):
        super().__init__(f"{what}: {g.gnutls_strerror(code).decode()} ({code})")
        self.code = code


class Session:
    """A client session on the connected socket sock (its fd; the socket object must
    outlive the session), with the client certificate of directory cli (tls-lib.sh's
    ca-cert.pem, client-cert.pem, client-key.pem) and priority string prio."""

    def __init__(self, g, sock, cli, prio="NORMAL"):
        self.g, self.sock = g, sock
        # GnuTLS reads the fd itself: blocking, with a bound on each wait (a Python
        # timeout would make the fd non-blocking).
        sock.settimeout(None)
        tv = struct.pack("ll", 20, 0)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, tv)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, tv)
        self.cred, self.s = ctypes.c_void_p(), ctypes.c_void_p()
        self.peer_key_updates = 0
        self.check("credentials", g.gnutls_certificate_allocate_credentials(ctypes.byref(self.cred)))
        self.check("CA", g.gnutls_certificate_set_x509_trust_file(
            self.cred, f"{cli}/ca-cert.pem".encode(), X509_FMT_PEM))
        self.check("key", g.gnutls_certificate_set_x509_key_file(
            self.cred, f"{cli}/client-cert.pem".encode(), f"{cli}/client-key.pem".encode(),
            X509_FMT_PEM))
        self.check("init", g.gnutls_init(ctypes.byref(self.s), CLIENT))
        self.check("priority", g.gnutls_priority_set_direct(self.s, prio.encode(), None))
        self.check("credentials", g.gnutls_credentials_set(self.s, CRD_CERTIFICATE, self.cred))
        g.gnutls_transport_set_int2(self.s, sock.fileno(), sock.fileno())
        self.hook = HOOK(self.on_handshake_message)  # kept: GnuTLS holds the pointer
        g.gnutls_handshake_set_hook_function(self.s, HANDSHAKE_KEY_UPDATE, HOOK_POST,
                                             self.hook)

    def on_handshake_message(self, _s, htype, _when, incoming, _msg):
        if htype == HANDSHAKE_KEY_UPDATE and incoming:
            self.peer_key_updates += 1
        return 0

    def check(self, what, ret):
        if ret < 0:
            raise TlsError(what, ret, self.g)
        return ret

    def retry(self, what, fn, *args):
        """fn(*args) again while GnuTLS says EAGAIN/EINTERRUPTED (a KeyUpdate it
        handled, or a 20 s wait for the socket that ended): the result, or TlsError."""
        start = time.monotonic()
        while True:
            ret = fn(*args)
            if ret not in (E_AGAIN, E_INTERRUPTED):
                return self.check(what, ret)
            if time.monotonic() - start > 60:
                raise AssertionError(f"{what}: nothing from the server in 60 s")

    def handshake(self):
        self.retry("handshake", self.g.gnutls_handshake, self.s)

    def version(self):
        return self.g.gnutls_protocol_get_version(self.s)

    def sendall(self, data):
        buf = ctypes.create_string_buffer(bytes(data), len(data))
        off = 0
        while off < len(data):
            off += self.retry("send", self.g.gnutls_record_send, self.s,
                              ctypes.byref(buf, off), len(data) - off)

    def recv(self, n):
        """Up to n bytes; b"" at the peer's close_notify."""
        buf = ctypes.create_string_buffer(n)
        got = self.retry("recv", self.g.gnutls_record_recv, self.s, buf, n)
        return buf.raw[:got]

    def recv_raw(self, n):
        """gnutls_record_recv's result as it is: (code, bytes)."""
        buf = ctypes.create_string_buffer(n)
        ret = self.g.gnutls_record_recv(self.s, buf, n)
        return ret, buf.raw[:max(ret, 0)]

    def key_update(self, flags):
        self.retry("key update", self.g.gnutls_session_key_update, self.s, flags)

    def alert(self, level, desc):
        self.retry("alert", self.g.gnutls_alert_send, self.s, level, desc)

    def bye(self, how=SHUT_WR):
        self.retry("bye", self.g.gnutls_bye, self.s, how)

    def close(self):
        if self.s:
            self.g.gnutls_deinit(self.s)
            self.g.gnutls_certificate_free_credentials(self.cred)
        self.s = None
