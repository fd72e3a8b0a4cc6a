"""Opens TCP connections inside sandboxes' network namespaces for the runner,
which started this process (outside every sandbox) with a Node IPC channel:

    python3 -I -S netns-connect.py          (NODE_CHANNEL_FD names the channel)

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
leads anywhere else. After each connect this process goes back to its own
namespace; if it cannot, it exits rather than open anything from the wrong
place.
"""

import ctypes
import errno
import json
import os
import socket
import sys

CLONE_NEWNET = 0x40000000
CONNECT_TIMEOUT = 2.0

libc = ctypes.CDLL(None, use_errno=True)


def setns(fd):
    if libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


channel = socket.socket(fileno=int(os.environ["NODE_CHANNEL_FD"]))
channel.setblocking(True)
own = os.open("/proc/self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
own_inode = os.fstat(own).st_ino
held = {}


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


def do_open(m):
    key = str(m["ns"])
    fd = None
    try:
        fd = os.open("/proc/%d/ns/net" % int(m["pid"]), os.O_RDONLY | os.O_CLOEXEC)
        if os.fstat(fd).st_ino == own_inode:
            raise OSError(errno.EINVAL, "the process shares this network namespace")
        setns(fd)  # tried now, so that the runner knows at once whether connections will come
        back_home()
    except (OSError, ValueError, KeyError) as e:
        if fd is not None:
            os.close(fd)
        send({"op": "opened", "ns": key, "error": str(e)})
        return
    old = held.pop(key, None)
    if old is not None:
        os.close(old)
    held[key] = fd
    send({"op": "opened", "ns": key})


def do_connect(m):
    reply = {"op": "connected", "id": m.get("id")}
    fd = held.get(str(m.get("ns")))
    if fd is None:
        send(dict(reply, error="unknown namespace"))
        return
    s = None
    try:
        setns(fd)
        try:
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        finally:
            back_home()
        s.settimeout(CONNECT_TIMEOUT)
        s.connect(("127.0.0.1", int(m["port"])))
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        # Non-blocking, as every socket of an event loop is: the runner's takes the descriptor as it is.
        s.setblocking(False)
        send(reply, s.fileno())
    except (OSError, ValueError, KeyError) as e:
        send(dict(reply, error=e.strerror if isinstance(e, OSError) and e.strerror else str(e)))
    finally:
        if s is not None:
            s.close()


def main():
    buf = b""
    while True:
        data = channel.recv(65536)
        if not data:
            return
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
                do_connect(m)
            elif op == "close":
                fd = held.pop(str(m.get("ns")), None)
                if fd is not None:
                    os.close(fd)


if __name__ == "__main__":
    try:
        main()
    except (BrokenPipeError, ConnectionResetError, KeyboardInterrupt):
        pass
    sys.exit(0)
