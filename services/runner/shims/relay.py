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
"""

import signal
import socket
import sys
import threading
import time

CONNECT_WAIT = 5.0


def pipe(src, dst):
    try:
        while True:
            data = src.recv(65536)
            if not data:
                break
            dst.sendall(data)
    except OSError:
        pass
    finally:
        try:
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            pass


def serve(client, port):
    deadline = time.monotonic() + CONNECT_WAIT
    while True:
        try:
            app = socket.create_connection(("127.0.0.1", port))
            break
        except OSError:
            if time.monotonic() > deadline:
                client.close()
                return
            time.sleep(0.003)
    app.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    back = threading.Thread(target=pipe, args=(app, client), daemon=True)
    back.start()
    pipe(client, app)
    back.join()
    client.close()
    app.close()


def main(fd, port):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    listener = socket.socket(fileno=fd)
    listener.setblocking(True)  # the runner's event loop made it non-blocking
    while True:
        conn, _ = listener.accept()
        threading.Thread(target=serve, args=(conn, port), daemon=True).start()


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]))
