"""Opens TCP connections inside sandboxes' network namespaces for the runner,
which started this process (outside every sandbox) with a Node IPC channel:

    python3 -I -S netns-connect.py DEADLINE_MS PER_NAMESPACE
                                            (NODE_CHANNEL_FD names the channel)

A sandboxed Custom app listens on 127.0.0.1:$PORT in a network namespace of
its own, which the runner's process cannot enter (Node has no setns). Without
this, every byte goes through the relay inside the sandbox (relay.py): two
more processes on the path of each request. Here a connection is made from
inside the namespace and its socket handed to the runner, which then talks
to the app directly.

Messages are JSON lines on the channel (Node's "json" serialization):

    {"op": "open", "ns": KEY, "pid": PID}     keep the network namespace of
        process PID under KEY (the sandbox's first process, just started, so
        its pid cannot have been reused); answered {"op": "opened", "ns": KEY}
        with "error" when it cannot be entered from here (it must not be this
        process's own, and entering it needs CAP_SYS_ADMIN: skiff as root)
    {"op": "connect", "id": N, "ns": KEY, "port": P}   answered with the
        connected socket as a Node handle, message {"op": "connected", "id": N},
        or {"op": "connected", "id": N, "error": ...} without one
    {"op": "close", "ns": KEY}               forget KEY

Node's own messages (NODE_HANDLE_ACK) are ignored. The namespace is held by
its file descriptor from "open" on, so a later pid of the same number never
leads anywhere else. Each socket is made inside its namespace, after which
this process goes back to its own at once; if it cannot, it exits rather than
open anything from the wrong place.

One app must never hold up another's connections: this process never waits
on a connect. Connects are non-blocking and one epoll loop watches them all;
each request is answered within DEADLINE_MS of its arrival, with an error
when the connection is not made by then (the app's listen backlog is full:
it accepts nothing, or its process is stopped), and the runner then goes
through the replica's channel. At most PER_NAMESPACE connects are under way
in one namespace; further requests for it wait their turn (within the same
deadline), so a replica that accepts nothing holds at most that many of this
process's sockets.
"""

import collections
import ctypes
import errno
import heapq
import itertools
import json
import os
import selectors
import socket
import sys
import time

CLONE_NEWNET = 0x40000000
DEADLINE = int(sys.argv[1]) / 1000 if len(sys.argv) > 1 else 2.0
PER_NAMESPACE = int(sys.argv[2]) if len(sys.argv) > 2 else 32

libc = ctypes.CDLL(None, use_errno=True)


def setns(fd):
    if libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


channel = socket.socket(fileno=int(os.environ["NODE_CHANNEL_FD"]))
# Blocking for writes (the runner reads its channel at all times); read only when the loop says it is readable.
channel.setblocking(True)
own = os.open("/proc/self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
own_inode = os.fstat(own).st_ino
held = {}
loop = selectors.DefaultSelector()


class Request:
    __slots__ = ("id", "ns", "port", "deadline", "sock", "done")

    def __init__(self, id, ns, port):
        self.id = id
        self.ns = ns
        self.port = port
        self.deadline = time.monotonic() + DEADLINE
        self.sock = None
        self.done = False


# Per namespace key: how many connects are under way, and the requests waiting for one of them to end.
under_way = collections.Counter()
waiting = collections.defaultdict(collections.deque)
# Every request not yet answered, by deadline (answered ones are skipped when they come up).
deadlines = []
order = itertools.count()


def send(message, fd=None):
    data = json.dumps(message).encode() + b"\n"
    if fd is None:
        channel.sendall(data)
    else:
        # The handle goes with the message that names it, as Node's child_process sends one.
        handle = {"cmd": "NODE_HANDLE", "type": "net.Socket", "msg": message}
        socket.send_fds(channel, [json.dumps(handle).encode() + b"\n"], [fd])


def back_home():
    try:
        setns(own)
    except OSError:
        os._exit(3)


def reason(e):
    return e.strerror if isinstance(e, OSError) and e.strerror else str(e)


def do_open(m):
    key = str(m["ns"])
    fd = None
    try:
        fd = os.open("/proc/%d/ns/net" % int(m["pid"]), os.O_RDONLY | os.O_CLOEXEC)
        if os.fstat(fd).st_ino == own_inode:
            raise OSError(errno.EINVAL, "the process shares this network namespace")
        setns(fd)  # tried now, so that the runner knows at once whether connections will come
        back_home()
    except (OSError, ValueError, KeyError, TypeError) as e:
        if fd is not None:
            os.close(fd)
        send({"op": "opened", "ns": key, "error": str(e)})
        return
    old = held.pop(key, None)
    if old is not None:
        os.close(old)
    held[key] = fd
    send({"op": "opened", "ns": key})


def answer(r, error=None, sock=None):
    """Answers r once: with its connected socket, or with why there is none."""
    r.done = True
    reply = {"op": "connected", "id": r.id}
    if error is None:
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError as e:
            error = reason(e)
    if error is None:
        # Non-blocking, as every socket of an event loop is: the runner's takes the descriptor as it is.
        send(reply, sock.fileno())
    else:
        send(dict(reply, error=error))


def begin(r):
    """Starts r's connect: under way (its socket watched, a slot of its namespace taken), or answered at once."""
    fd = held.get(r.ns)
    if fd is None:
        answer(r, "unknown namespace")
        return
    s = None
    try:
        setns(fd)
        try:
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        finally:
            back_home()
        s.setblocking(False)
        err = s.connect_ex(("127.0.0.1", r.port))
        if err == errno.EINPROGRESS:
            loop.register(s, selectors.EVENT_WRITE, r)
            r.sock, s = s, None
            under_way[r.ns] += 1
        elif err:
            answer(r, os.strerror(err))
        else:
            answer(r, None, s)
    except (OSError, OverflowError) as e:
        answer(r, reason(e))
    finally:
        if s is not None:
            s.close()


def busy():
    return "not connected within %g s: %d connections to this sandbox were under way" % (DEADLINE, PER_NAMESPACE)


def start_waiting(ns):
    """Starts the requests of namespace ns that wait, while it has free slots; expired ones are answered."""
    queue = waiting.get(ns)
    while queue and under_way[ns] < PER_NAMESPACE:
        r = queue.popleft()
        if r.done:
            continue
        if r.deadline <= time.monotonic():
            answer(r, busy())
        else:
            begin(r)
    if not queue:
        waiting.pop(ns, None)
    if under_way[ns] == 0:
        under_way.pop(ns, None)


def end(r, error=None):
    """Ends a connect under way (answering r unless the runner has its answer) and frees its slot."""
    s, r.sock = r.sock, None
    loop.unregister(s)
    try:
        if not r.done:
            answer(r, error, s)
    finally:
        s.close()
        under_way[r.ns] -= 1
        start_waiting(r.ns)


def connect(m):
    try:
        r = Request(m.get("id"), str(m["ns"]), int(m["port"]))
    except (KeyError, TypeError, ValueError) as e:
        send({"op": "connected", "id": m.get("id"), "error": str(e)})
        return
    if r.ns not in held:
        answer(r, "unknown namespace")
        return
    heapq.heappush(deadlines, (r.deadline, next(order), r))
    if under_way[r.ns] < PER_NAMESPACE and not waiting.get(r.ns):
        begin(r)
    else:
        waiting[r.ns].append(r)


def expire(now):
    """Answers every request past its deadline: its connect is given up, or it never got a slot."""
    while deadlines and (deadlines[0][2].done or deadlines[0][0] <= now):
        _, _, r = heapq.heappop(deadlines)
        if r.done:
            continue
        if r.sock is not None:
            end(r, "not connected within %g s: the app is not accepting connections" % DEADLINE)
        else:
            answer(r, busy())


def read_channel(buf):
    data = channel.recv(65536)
    if not data:
        return None
    buf += data
    while b"\n" in buf:
        line, buf = buf.split(b"\n", 1)
        try:
            m = json.loads(line)
        except ValueError:
            continue
        if not isinstance(m, dict) or "cmd" in m:
            continue
        op = m.get("op")
        if op == "open":
            do_open(m)
        elif op == "connect":
            connect(m)
        elif op == "close":
            fd = held.pop(str(m.get("ns")), None)
            if fd is not None:
                os.close(fd)
    return buf


def main():
    loop.register(channel, selectors.EVENT_READ, None)
    buf = b""
    while True:
        while deadlines and deadlines[0][2].done:
            heapq.heappop(deadlines)
        timeout = max(0.0, deadlines[0][0] - time.monotonic()) if deadlines else None
        for key, _ in loop.select(timeout):
            r = key.data
            if r is None:
                buf = read_channel(buf)
                if buf is None:
                    return
            elif r.sock is not None:
                err = r.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                end(r, os.strerror(err) if err else None)
        expire(time.monotonic())


if __name__ == "__main__":
    try:
        main()
    except (BrokenPipeError, ConnectionResetError, KeyboardInterrupt):
        pass
    sys.exit(0)
