"""Serves a Cortex Python app: the public functions of one module over HTTP.

    python3 -u cortex.py ENTRY           serve on 127.0.0.1:$PORT
    python3 -u cortex.py --fd N ENTRY    serve on the listening socket fd N
                                         (the sandbox's channel, a Unix socket)
    python3 -u cortex.py --list ENTRY    print the public function names as JSON

When the module cannot be loaded, --list prints the traceback to stderr (the
runner's log) and, as its last stdout line, only {"error": {"type", "where"}}:
the exception's type and the app file and line it came from, never its
message, which may quote any file the module read.

Only the standard library, so an app needs nothing installed to run.

GET /health answers 200 once the module is loaded (it is loaded before the
port opens). POST /{function} calls function(**body): the body must be a JSON
object (an empty body is {}); the answer is 200 with the JSON result, or 500
{"error": {"type", "message"}} when it raised (the traceback goes to stderr,
the app's log, never to the caller), 400 {"error": {"type":
"invalid_argument", "message"}} when the body is not a JSON object or its
fields do not fit the function's signature (a required parameter missing, a
name it has no parameter for and no **kwargs to take), naming the parameter,
before the function runs; 404 for a name that is not a public function. A
function with a parameter named run_id gets the run's id there (the
X-Request-Id of its call), whatever the body says. Public: a function defined in
the module itself whose name does not start with "_"; imported functions,
classes, modules and other values are not exposed. async functions are run
to completion.

A function that returns a generator (sync or async) streams what it yields
when the request's Accept asks for it: text/event-stream as server-sent
events (`event: result` per item, `event: error` when it raises),
application/x-ndjson as one {"result": item} line per item ({"error": {...}}
when it raises), each written as it comes, at the pace the caller reads. A
failure also goes out as the trailer X-Skiff-Error ({"type","message"}), for
the run's record. With any other Accept the items are collected and answered
as one JSON array.

On SIGTERM the server stops accepting, finishes the requests in flight, and
exits 0.
"""

import asyncio
import importlib.util
import inspect
import json
import os
import signal
import socket
import sys
import threading
import traceback
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def load(entry):
    path = os.path.abspath(entry)
    # Sibling modules import as they would when the app runs as a script.
    for folder in (os.path.dirname(path), os.getcwd()):
        if folder not in sys.path:
            sys.path.insert(0, folder)
    name = os.path.splitext(os.path.basename(path))[0]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def public_functions(module):
    return {
        name: value
        for name, value in vars(module).items()
        if not name.startswith("_") and inspect.isfunction(value) and value.__module__ == module.__name__
    }


STREAM_FORMATS = {
    "text/event-stream": ("event: result\ndata: %s\n\n", "event: error\ndata: %s\n\n"),
    "application/x-ndjson": ('{"result":%s}\n', '{"error":%s}\n'),
}


def stream_format(accept):
    for content_type, (item, error) in STREAM_FORMATS.items():
        if content_type in accept:
            return content_type, item, error
    return None


def generate(result):
    """A generator's items, an async one's too (driven on a loop of its own)."""
    if inspect.isgenerator(result):
        return result

    def drive():
        loop = asyncio.new_event_loop()
        try:
            while True:
                try:
                    yield loop.run_until_complete(result.__anext__())
                except StopAsyncIteration:
                    return
        finally:
            loop.run_until_complete(result.aclose())
            loop.close()

    return drive()


def takes_run_id(function):
    """Whether the function names a run_id parameter, which the run's id fills."""
    try:
        p = inspect.signature(function).parameters.get("run_id")
    except (TypeError, ValueError):
        return False
    return p is not None and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)


def misfit(name, function, kwargs):
    """Why kwargs cannot be the function's keyword arguments, naming the parameter; None when they can."""
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):
        return None
    params = signature.parameters.values()
    named = [p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    prefix = f"the caller's body does not fit {name}({', '.join(named)})"
    if not any(p.kind == p.VAR_KEYWORD for p in params):
        unknown = [k for k in kwargs if k not in named]
        if unknown:
            return f'{prefix}: unknown parameter "{unknown[0]}"'
    for p in params:
        if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.default is p.empty and p.name not in kwargs:
            return f'{prefix}: missing required parameter "{p.name}"'
    try:
        signature.bind(**kwargs)
    except TypeError as err:
        return f"{prefix}: {err}"
    return None


def error_body(kind, message):
    return json.dumps({"error": {"type": kind, "message": message}}, separators=(",", ":")).encode()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: the runner reuses connections
    busy = False

    def log_message(self, format, *args):
        pass  # the runner logs requests; stderr is the app's own

    def address_string(self):
        return "runner"  # a Unix socket peer has no address

    def send_response(self, code, message=None):
        # The status line alone: BaseHTTPRequestHandler would add Server (naming the shim and
        # Python's version) and Date, which a streamed answer would carry to the caller.
        self.send_response_only(code, message)

    def setup(self):
        super().setup()
        self.server.connections.add(self)

    def finish(self):
        self.server.connections.discard(self)
        super().finish()

    def reply(self, status, body):
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        if self.server.draining:
            self.close_connection = True
            self.send_header("Connection", "close")
        self.end_headers()
        try:
            self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the caller went away (a cancelled run)
        self.busy = False

    def do_GET(self):
        self.busy = True
        if self.path == "/health":
            self.reply(200, b'{"status":"ok"}')
        else:
            self.reply(404, error_body("NotFound", "call a function with POST /{function}"))

    def do_POST(self):
        self.busy = True
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length > 0 else b""
        name = self.path.split("?", 1)[0].lstrip("/")
        function = self.server.functions.get(name)
        if function is None:
            return self.reply(404, error_body("FunctionNotFound", f'no public function "{name}"'))
        try:
            kwargs = json.loads(raw) if raw.strip() else {}
        except ValueError as err:
            return self.reply(400, error_body("invalid_argument", f"the body is not valid JSON: {err}"))
        if not isinstance(kwargs, dict):
            return self.reply(400, error_body("invalid_argument", "the body must be a JSON object whose fields are the function's arguments"))
        if takes_run_id(function):
            kwargs["run_id"] = self.headers.get("X-Request-Id", "")
        wrong = misfit(name, function, kwargs)
        if wrong is not None:
            return self.reply(400, error_body("invalid_argument", wrong))
        try:
            result = function(**kwargs)
            if inspect.isawaitable(result):
                result = asyncio.run(result)
            if inspect.isgenerator(result) or inspect.isasyncgen(result):
                items = generate(result)
                form = stream_format(self.headers.get("Accept", ""))
                if form is not None:
                    return self.stream(name, items, form)
                result = list(items)
            body = json.dumps(result, separators=(",", ":")).encode()
        except BaseException as err:  # noqa: B036 - any failure is the function's answer
            return self.reply(500, error_body(*self.failed(name, err)))
        self.reply(200, body)

    def failed(self, name, err):
        """The error's type and message; its traceback goes to stderr, the app's log."""
        print(f"run {self.headers.get('X-Request-Id', '')}: {name} raised", file=sys.stderr)
        # From the function's frame on: the shim's own frame is noise to the app.
        traceback.print_exception(type(err), err, err.__traceback__.tb_next)
        return type(err).__name__, str(err)

    def stream(self, name, items, form):
        """Writes each item as a chunk as it comes; a full socket blocks the generator (back-pressure)."""
        content_type, item_form, error_form = form
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("Trailer", "X-Skiff-Error")
        if self.server.draining:
            self.close_connection = True
            self.send_header("Connection", "close")
        self.end_headers()
        trailer = b""
        try:
            try:
                for item in items:
                    self.chunk(item_form % json.dumps(item, separators=(",", ":")))
            except (BrokenPipeError, ConnectionResetError):
                raise
            except BaseException as err:  # noqa: B036 - any failure is the function's answer
                kind, message = self.failed(name, err)
                self.chunk(error_form % json.dumps({"type": kind, "message": message}, separators=(",", ":")))
                # A header value is ASCII: json.dumps escapes the rest.
                trailer = b"X-Skiff-Error: " + json.dumps({"type": kind, "message": message[:500]}).encode() + b"\r\n"
            self.wfile.write(b"0\r\n" + trailer + b"\r\n")
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True  # the caller went away (a cancelled run)
        finally:
            items.close()
        self.busy = False

    def chunk(self, text):
        data = text.encode()
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))


class Server(ThreadingHTTPServer):
    daemon_threads = False  # server_close() waits for requests in flight
    draining = False

    def __init__(self, address, functions, fd=None):
        super().__init__(address, Handler, bind_and_activate=fd is None)
        if fd is not None:
            self.socket.close()
            self.socket = socket.socket(fileno=fd)
        self.functions = functions
        self.connections = set()

    def drain(self):
        self.draining = True
        self.shutdown()
        # Idle keep-alive connections would hold their threads forever.
        for handler in list(self.connections):
            if not handler.busy:
                try:
                    handler.connection.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass


def where(err):
    """The app file and line an exception came from, relative to the working folder."""
    home = os.getcwd() + os.sep
    if isinstance(err, SyntaxError) and err.filename and os.path.abspath(err.filename).startswith(home):
        return f"{os.path.relpath(err.filename)}:{err.lineno or 0}"
    found = None
    for frame in traceback.extract_tb(err.__traceback__):
        if os.path.abspath(frame.filename).startswith(home):
            found = f"{os.path.relpath(frame.filename)}:{frame.lineno}"
    return found


def main(argv):
    listing = argv[:1] == ["--list"]
    fd = None
    args = argv[1:] if listing else argv
    if args[:1] == ["--fd"] and len(args) > 1:
        fd = int(args[1])
        args = args[2:]
    if len(args) != 1:
        print("usage: cortex.py [--list | --fd N] ENTRY", file=sys.stderr)
        return 2
    try:
        functions = public_functions(load(args[0]))
    except BaseException as err:  # noqa: B036 - reported without its message
        if not listing:
            raise
        traceback.print_exc()
        print()
        print(json.dumps({"error": {"type": type(err).__name__, "where": where(err)}}))
        return 1
    if listing:
        print()
        print(json.dumps(sorted(functions)))
        return 0
    if fd is not None:
        server = Server(None, functions, fd=fd)
    else:
        server = Server(("127.0.0.1", int(os.environ["PORT"])), functions)
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.drain).start())
    server.serve_forever()
    server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
