"""Relays the sandbox's channel to a Custom app, which listens on
127.0.0.1:$PORT inside its own network namespace:

    python3 -I -S relay.py FD PORT

Accepts on the listening Unix socket FD (handed over by the runner) and pipes
each connection to 127.0.0.1:PORT, waiting (up to CONNECT_WAIT seconds) for
the app to listen, so that the runner's first healthcheck gets through as
soon as the app is up. It ignores SIGTERM, which is the app's to act on
(draining); it ends with the sandbox. Python starts in a fraction of Node's
time, which keeps a Custom app's cold start close to the app's own; relay.mjs
does the same where there is no python3.

One thread, one epoll, non-blocking sockets. Bytes read from one side are
written to the other at once; what the other side does not take yet waits in
a buffer of at most BUFFER_MAX bytes per direction, and while it is full that
side is not read (back-pressure reaches the sender through its socket). An
end of input on one side becomes shutdown(SHUT_WR) on the other once its
buffer is written; a connection ends when both directions have, or at the
first error on either side. Nothing is ever held back waiting for more
bytes, so a response that trickles out is forwarded chunk by chunk, and an
idle connection stays open as long as both sides keep it.
"""

import errno
import select
import signal
import socket
import sys
import time

CONNECT_WAIT = 5.0
CONNECT_RETRY = 0.003
READ_SIZE = 262144
BUFFER_MAX = 262144

IN = select.EPOLLIN
OUT = select.EPOLLOUT
FAULT = select.EPOLLERR | select.EPOLLHUP
AGAIN = (errno.EAGAIN, errno.EINTR)


class Side:
    """One socket of a connection and the bytes waiting to be written to it."""

    __slots__ = ("sock", "pending", "eof", "shut", "events")

    def __init__(self, sock):
        self.sock = sock
        self.pending = bytearray()  # read from the other side, not yet written to this one
        self.eof = False  # this socket's input has ended
        self.shut = False  # shutdown(SHUT_WR) done on this socket
        self.events = 0  # what it is registered for


class Conn:
    __slots__ = ("client", "app", "deadline", "retry_at", "connecting", "open", "closed")

    def __init__(self, client, deadline):
        self.client = Side(client)
        self.app = Side(None)
        self.deadline = deadline
        self.retry_at = 0.0
        self.connecting = False  # a connect to the app is under way
        self.open = False  # both sides connected: bytes flow
        self.closed = False


class Relay:
    def __init__(self, listener, port):
        self.listener = listener
        self.listen_fd = listener.fileno()
        self.port = port
        self.poll = select.epoll()
        self.by_fd = {}  # fd -> (conn, side, peer)
        self.waiting = []  # connections whose app was not listening yet, to dial again
        self.poll.register(self.listen_fd, IN)

    def run(self):
        while True:
            timeout = -1
            if self.waiting:
                timeout = max(0.0, min(c.retry_at for c in self.waiting) - time.monotonic())
            try:
                events = self.poll.poll(timeout)
            except InterruptedError:
                continue
            for fd, ev in events:
                if fd == self.listen_fd:
                    self.accept()
                    continue
                entry = self.by_fd.get(fd)
                if entry is None:
                    continue  # closed earlier in this round
                conn, side, peer = entry
                if conn.closed:
                    continue
                if conn.connecting:
                    self.connected(conn, ev)
                    continue
                if ev & (OUT | FAULT) and side.pending:
                    self.write(conn, side, peer)
                if not conn.closed and ev & (IN | FAULT) and side.events & IN:
                    self.read(conn, side, peer)
                if not conn.closed:
                    self.settle(conn)
            if self.waiting:
                self.redial()

    # -- connections

    def accept(self):
        while True:
            try:
                sock, _ = self.listener.accept()
            except OSError:
                # EAGAIN: no more for now; the others (EMFILE, ECONNABORTED…) leave the listener usable.
                return
            sock.setblocking(False)
            self.dial(Conn(sock, time.monotonic() + CONNECT_WAIT))

    def dial(self, conn):
        """Connects to the app; while it is not listening, again every CONNECT_RETRY until the deadline."""
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        code = sock.connect_ex(("127.0.0.1", self.port))
        if code not in (0, errno.EINPROGRESS):
            sock.close()
            self.later(conn)
            return
        conn.app.sock = sock
        self.by_fd[sock.fileno()] = (conn, conn.app, conn.client)
        if code == 0:
            self.begin(conn)
        else:
            conn.connecting = True
            self.register(conn.app, OUT)

    def connected(self, conn, ev):
        app = conn.app
        code = app.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        if code == 0 and not ev & FAULT:
            conn.connecting = False
            self.begin(conn)
            return
        self.drop(app)
        conn.connecting = False
        self.later(conn)

    def later(self, conn):
        now = time.monotonic()
        if now >= conn.deadline:
            self.close(conn)
            return
        conn.retry_at = now + CONNECT_RETRY
        self.waiting.append(conn)

    def redial(self):
        now = time.monotonic()
        due = [c for c in self.waiting if c.retry_at <= now]
        if due:
            self.waiting = [c for c in self.waiting if c.retry_at > now]
            for conn in due:
                self.dial(conn)

    def begin(self, conn):
        """Both sides connected: the caller's bytes, which waited in its socket until now, start to flow."""
        conn.open = True
        self.by_fd[conn.client.sock.fileno()] = (conn, conn.client, conn.app)
        self.settle(conn)

    def drop(self, side):
        if side.sock is None:
            return
        self.by_fd.pop(side.sock.fileno(), None)
        if side.events:
            self.poll.unregister(side.sock)
            side.events = 0
        side.sock.close()
        side.sock = None

    def close(self, conn):
        conn.closed = True
        self.drop(conn.client)
        self.drop(conn.app)

    # -- bytes

    def read(self, conn, side, peer):
        """Reads what side has for its peer, while the peer's buffer has room, and writes it on at once."""
        while len(peer.pending) < BUFFER_MAX:
            try:
                data = side.sock.recv(READ_SIZE)
            except OSError as e:
                if e.errno not in AGAIN:
                    self.close(conn)
                return
            if not data:
                side.eof = True
                self.write(conn, peer, side)
                return
            if not peer.pending:
                # The usual case: straight through, no copy into the buffer.
                try:
                    n = peer.sock.send(data)
                except OSError as e:
                    if e.errno not in AGAIN:
                        self.close(conn)
                        return
                    n = 0
                if n < len(data):
                    peer.pending += memoryview(data)[n:]
                continue
            peer.pending += data
            self.write(conn, peer, side)
            if conn.closed:
                return

    def write(self, conn, side, peer):
        """Writes as much of side's buffer as its socket takes now; passes an end of input on once it is all out."""
        while side.pending:
            try:
                n = side.sock.send(side.pending)
            except OSError as e:
                if e.errno not in AGAIN:
                    self.close(conn)
                return
            del side.pending[:n]
        if peer.eof and not side.shut:
            side.shut = True
            try:
                side.sock.shutdown(socket.SHUT_WR)
            except OSError:
                pass

    def settle(self, conn):
        """Registers both sides for what they wait on now; ends the connection once both directions have."""
        if conn.client.shut and conn.app.shut:
            self.close(conn)
            return
        for side, peer in ((conn.client, conn.app), (conn.app, conn.client)):
            want = 0
            if not side.eof and len(peer.pending) < BUFFER_MAX:
                want |= IN
            if side.pending:
                want |= OUT
            self.register(side, want)

    def register(self, side, want):
        if want == side.events:
            return
        if side.events == 0:
            self.poll.register(side.sock, want)
        elif want == 0:
            self.poll.unregister(side.sock)
        else:
            self.poll.modify(side.sock, want)
        side.events = want


def main(fd, port):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    listener = socket.socket(fileno=fd)
    listener.setblocking(False)  # as the runner's event loop left it
    Relay(listener, port).run()


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]))
