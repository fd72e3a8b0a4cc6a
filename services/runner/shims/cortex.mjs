// Serves a Cortex Node app: the exported functions of one ES module over HTTP.
//
//   node cortex.mjs ENTRY           serve on 127.0.0.1:$PORT
//   node cortex.mjs --fd N ENTRY    serve on the listening socket fd N (the
//                                   sandbox's channel, a Unix socket)
//   node cortex.mjs --list ENTRY    print the public function names as JSON
//
// When the module cannot be loaded, --list prints the stack to stderr (the
// runner's log) and, as its last stdout line, only {"error": {"type",
// "code", "where"}}: the error's name and code and the app file and line it
// came from, never its message, which may quote any file the module read.
//
// GET /health answers 200 once the module is loaded (it is loaded before the
// port opens). POST /{function} calls function(body) with the JSON object of
// the body (an empty body is {}), awaiting it when it is async: 200 with the
// JSON result, 500 {"error": {"type", "message"}} when it threw (the stack
// goes to stderr, the app's log, never to the caller), 400 {"error": {"type":
// "invalid_argument", "message"}} when the body is not a JSON object or does
// not fit the function's signature (below), naming the parameter, before the
// function runs; 404 for a name that is not public. Public: an exported
// function, not a class, whose name does not start with "_" (the default
// export has no name and is not exposed).
//
// A Node function takes the body as one object, so its signature is its
// first parameter when that is an object pattern: `({ prompt, n = 1 })`
// takes `prompt` (required: no default) and `n` (optional), and no other
// key unless the pattern has a rest element (`...rest`), as **kwargs in
// Python. No parameter, a first parameter that is a plain name (`(args)`),
// or a pattern with quoted or computed keys declares nothing: any object is
// passed. A pattern that declares `run_id` gets the run's id there (the
// X-Request-Id of its call), whatever the body says.
//
// A function that returns a generator (sync or async) streams what it
// yields when the request's Accept asks for it: text/event-stream as
// server-sent events (`event: result` per item, `event: error` when it
// throws), application/x-ndjson as one `{"result": item}` line per item
// (`{"error": {...}}` when it throws), each written as it comes, at the pace
// the caller reads. A failure also goes out as the trailer X-Skiff-Error
// ({"type","message"}), for the run's record. With any other Accept the
// items are collected and answered as one JSON array.
//
// On SIGTERM the server stops accepting, finishes the requests in flight
// (each answer written out in full), and exits 0.
import http from "node:http";
import net from "node:net";
import path from "node:path";
import { pathToFileURL } from "node:url";

async function publicFunctions(entry) {
  const mod = await import(pathToFileURL(path.resolve(entry)).href);
  const functions = new Map();
  for (const [name, value] of Object.entries(mod)) {
    if (name === "default" || name.startsWith("_") || typeof value !== "function") continue;
    if (/^class\b/.test(Function.prototype.toString.call(value))) continue;
    functions.set(name, value);
  }
  return functions;
}

/** The index of the bracket that closes the one at `open`, skipping strings, templates and comments; -1 if none. */
function closing(src, open) {
  const pairs = { "(": ")", "[": "]", "{": "}" };
  const stack = [];
  for (let i = open; i < src.length; i++) {
    const c = src[i];
    if (c === '"' || c === "'" || c === "`") {
      for (i++; i < src.length && src[i] !== c; i++) if (src[i] === "\\") i++;
    } else if (c === "/" && src[i + 1] === "*") {
      i = src.indexOf("*/", i + 2);
      if (i < 0) return -1;
      i++;
    } else if (c === "/" && src[i + 1] === "/") {
      i = src.indexOf("\n", i);
      if (i < 0) return -1;
    } else if (pairs[c]) stack.push(pairs[c]);
    else if (c === ")" || c === "]" || c === "}") {
      if (stack.pop() !== c) return -1;
      if (stack.length === 0) return i;
    }
  }
  return -1;
}

/** The text split at the commas outside brackets and strings. */
function topLevel(text, separator) {
  const parts = [];
  let start = 0;
  for (let i = 0; i < text.length; i++) {
    const c = text[i];
    if (c === "/" && (text[i + 1] === "*" || text[i + 1] === "/")) {
      const end = text[i + 1] === "*" ? text.indexOf("*/", i + 2) + 1 : text.indexOf("\n", i);
      if (end <= 0) return undefined;
      i = end;
    } else if (c === "(" || c === "[" || c === "{" || c === '"' || c === "'" || c === "`") {
      const end = closingOf(text, i);
      if (end < 0) return undefined;
      i = end;
    } else if (c === separator) {
      parts.push(text.slice(start, i));
      start = i + 1;
    }
  }
  parts.push(text.slice(start));
  return parts;
}

function closingOf(text, i) {
  const c = text[i];
  if (c === '"' || c === "'" || c === "`") {
    for (let j = i + 1; j < text.length; j++) {
      if (text[j] === "\\") j++;
      else if (text[j] === c) return j;
    }
    return -1;
  }
  return closing(text, i);
}

/**
 * The keys a function's first parameter declares (see the head of this
 * file): a Map of key to whether it is required, and whether a rest element
 * takes any other key; undefined when it declares none.
 */
export function declaredKeys(fn) {
  if (!declared.has(fn)) declared.set(fn, readKeys(fn));
  return declared.get(fn);
}

const declared = new WeakMap();

function readKeys(fn) {
  const src = Function.prototype.toString.call(fn);
  const open = src.indexOf("(");
  const arrow = src.indexOf("=>");
  if (open < 0 || (arrow >= 0 && arrow < open)) return undefined;
  const params = src.slice(open + 1);
  const first = params.search(/\S/);
  if (params[first] !== "{") return undefined;
  const end = closing(params, first);
  if (end < 0) return undefined;
  const items = topLevel(params.slice(first + 1, end), ",");
  if (!items) return undefined;
  const keys = new Map();
  let rest = false;
  for (const raw of items) {
    const item = raw
      .replace(/\/\*[\s\S]*?\*\//g, "")
      .replace(/\/\/.*$/gm, "")
      .trim();
    if (item === "") continue;
    if (item.startsWith("...")) {
      rest = true;
      continue;
    }
    const m = /^([A-Za-z_$][\w$]*)\s*([\s\S]*)$/.exec(item);
    if (!m) return undefined;
    const tail = m[2];
    let required;
    if (tail === "") required = true;
    else if (tail.startsWith("=")) required = false;
    else if (tail.startsWith(":")) required = (topLevel(tail.slice(1), "=") ?? []).length < 2;
    else return undefined;
    keys.set(m[1], required);
  }
  return { keys, rest };
}

/** Why `args` does not fit the function's declared keys, naming the key; undefined when it fits. */
function misfit(name, fn, args) {
  const declared = declaredKeys(fn);
  if (!declared) return undefined;
  const prefix = `the caller's body does not fit ${name}({ ${[...declared.keys.keys()].join(", ")} })`;
  if (!declared.rest) {
    const unknown = Object.keys(args).find((k) => !declared.keys.has(k));
    if (unknown !== undefined) return `${prefix}: unknown parameter "${unknown}"`;
  }
  for (const [key, required] of declared.keys)
    if (required && !Object.hasOwn(args, key)) return `${prefix}: missing required parameter "${key}"`;
  return undefined;
}

function errorBody(type, message) {
  return JSON.stringify({ error: { type, message } });
}

function reply(res, status, body) {
  res.writeHead(status, { "content-type": "application/json", "content-length": Buffer.byteLength(body) });
  res.end(body);
}

async function call(functions, req, res, raw) {
  const name = (req.url ?? "/").split("?", 1)[0].slice(1);
  const fn = functions.get(name);
  if (!fn) return reply(res, 404, errorBody("FunctionNotFound", `no public function "${name}"`));
  let args;
  try {
    args = raw.trim() === "" ? {} : JSON.parse(raw);
  } catch (err) {
    return reply(res, 400, errorBody("invalid_argument", `the body is not valid JSON: ${err.message}`));
  }
  if (typeof args !== "object" || args === null || Array.isArray(args)) {
    return reply(
      res,
      400,
      errorBody("invalid_argument", "the body must be a JSON object whose fields are the function's arguments"),
    );
  }
  if (declaredKeys(fn)?.keys.has("run_id")) args.run_id = String(req.headers["x-request-id"] ?? "");
  const wrong = misfit(name, fn, args);
  if (wrong !== undefined) return reply(res, 400, errorBody("invalid_argument", wrong));
  let body;
  try {
    const result = await fn(args);
    const format = isGenerator(result) ? streamFormat(req.headers.accept) : undefined;
    if (format) return await stream(req, res, name, result, format);
    body = JSON.stringify((isGenerator(result) ? await collect(result) : result) ?? null);
  } catch (err) {
    const [type, message] = failed(req, name, err);
    return reply(res, 500, errorBody(type, message));
  }
  reply(res, 200, body);
}

/** The error's type and message; its stack goes to stderr, the app's log. */
function failed(req, name, err) {
  const type = err instanceof Error ? err.name || err.constructor.name : typeof err;
  const message = err instanceof Error ? err.message : String(err);
  console.error(`run ${req.headers["x-request-id"] ?? ""}: ${name} threw`);
  console.error(err instanceof Error ? err.stack : err);
  return [type, message];
}

function isGenerator(value) {
  const tag = Object.prototype.toString.call(value);
  return tag === "[object Generator]" || tag === "[object AsyncGenerator]";
}

async function collect(generator) {
  const items = [];
  for await (const item of generator) items.push(item);
  return items;
}

const FORMATS = {
  "text/event-stream": {
    item: (json) => `event: result\ndata: ${json}\n\n`,
    error: (json) => `event: error\ndata: ${json}\n\n`,
  },
  "application/x-ndjson": {
    item: (json) => `{"result":${json}}\n`,
    error: (json) => `{"error":${json}}\n`,
  },
};

function streamFormat(accept = "") {
  const type = Object.keys(FORMATS).find((t) => accept.includes(t));
  return type && { type, ...FORMATS[type] };
}

/** Writes each item as it comes, waiting for the caller to read; stops the generator when the caller is gone. */
async function stream(req, res, name, generator, format) {
  res.writeHead(200, { "content-type": format.type, "cache-control": "no-cache", trailer: "x-skiff-error" });
  res.flushHeaders();
  let gone = false;
  res.on("close", () => (gone = !res.writableFinished));
  try {
    for await (const item of generator) {
      if (gone) break;
      if (!res.write(format.item(JSON.stringify(item ?? null)))) {
        await new Promise((resolve) => {
          res.once("drain", resolve);
          res.once("close", resolve);
        });
      }
    }
  } catch (err) {
    const [type, message] = failed(req, name, err);
    const error = JSON.stringify({ type, message });
    res.write(format.error(error));
    // A header value is ASCII: JSON's \u escapes for the rest.
    const trailer = JSON.stringify({ type, message: message.slice(0, 500) }).replace(
      /[\u007f-\uffff]/g,
      (c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, "0")}`,
    );
    res.addTrailers({ "x-skiff-error": trailer });
  } finally {
    if (gone) await generator.return?.();
  }
  res.end();
}

/** The app file and line an error came from, relative to the working folder. */
function where(err) {
  const home = pathToFileURL(process.cwd()).href + "/";
  const text = `${err instanceof Error ? err.stack : ""}`;
  for (const m of text.matchAll(/(file:\/\/[^\s):]+):(\d+)/g)) {
    if (m[1].startsWith(home)) return `${decodeURIComponent(m[1].slice(home.length))}:${m[2]}`;
  }
  return null;
}

async function main(argv) {
  const listing = argv[0] === "--list";
  let args = listing ? argv.slice(1) : argv;
  let fd;
  if (args[0] === "--fd" && args.length > 1) {
    fd = Number(args[1]);
    args = args.slice(2);
  }
  if (args.length !== 1) {
    console.error("usage: cortex.mjs [--list | --fd N] ENTRY");
    return 2;
  }
  let functions;
  try {
    functions = await publicFunctions(args[0]);
  } catch (err) {
    if (!listing) throw err;
    console.error(err instanceof Error ? err.stack : err);
    const type = err instanceof Error ? err.name : typeof err;
    const code = typeof err?.code === "string" ? err.code : null;
    process.stdout.write(`\n${JSON.stringify({ error: { type, code, where: where(err) } })}\n`);
    return 1;
  }
  if (listing) {
    process.stdout.write(`\n${JSON.stringify([...functions.keys()].sort())}\n`);
    return 0;
  }
  const server = http.createServer((req, res) => {
    // No Date of the shim's own: a streamed answer passes its headers to the caller, whose Date is skiff's.
    res.sendDate = false;
    answering(req.socket, res);
    if (req.method === "GET" && req.url === "/health") return reply(res, 200, '{"status":"ok"}');
    if (req.method !== "POST") return reply(res, 404, errorBody("NotFound", "call a function with POST /{function}"));
    const chunks = [];
    req.on("data", (c) => chunks.push(c));
    req.on("end", () => void call(functions, req, res, Buffer.concat(chunks).toString("utf8")));
  });
  server.on("connection", (socket) => {
    open.add(socket);
    socket.on("close", () => open.delete(socket));
  });
  process.on("SIGTERM", () => drain(server));
  if (fd !== undefined) server.listen({ fd });
  else server.listen(Number(process.env.PORT), "127.0.0.1");
  return undefined;
}

/** Connections whose answer is not yet handed to the system in full. */
const busy = new Set();
const open = new Set();
let draining = false;

function answering(socket, res) {
  busy.add(socket);
  if (draining) res.shouldKeepAlive = false;
  res.on("finish", () => {
    busy.delete(socket);
    if (draining) socket.end();
  });
  res.on("close", () => busy.delete(socket));
}

/**
 * SIGTERM: no new connections, the answers under way written out in full,
 * then exit 0. Not http's server.close(): it also destroys a connection
 * whose answer has ended but is still being written (a large answer,
 * or a caller that reads slowly), which cut such an answer short.
 */
function drain(server) {
  if (draining) return;
  draining = true;
  net.Server.prototype.close.call(server, () => process.exit(0));
  for (const socket of open) if (!busy.has(socket)) socket.destroy();
}

main(process.argv.slice(2)).then(
  (code) => {
    if (code !== undefined) process.exitCode = code;
  },
  (err) => {
    console.error(err instanceof Error ? err.stack : err);
    process.exit(1);
  },
);
