// A Custom app whose answers stream: skiff passes each chunk to the caller
// as the app writes it (an answer without Content-Length, or one of type
// text/event-stream), at the pace the caller reads.
//
//   GET  /ticks?n=5&ms=200   server-sent events: n ticks, one every ms
//   POST /words              NDJSON: one line per word of the body
//   GET  /gate/{name}        one event, then waits until POST /open/{name}
//   GET  /flood?mb=64        mb MiB of bytes, written as fast as the caller reads
//   GET  /state              what /flood wrote so far, and gates seen closing early
import http from "node:http";

const gates = new Map(); // name -> resolve
const state = { flooded: 0, closedEarly: [] };

const server = http.createServer((req, res) => {
  const url = new URL(req.url ?? "/", "http://app");
  const [, first, name] = url.pathname.split("/");
  if (url.pathname === "/health") return json(res, 200, { status: "ok" });
  if (url.pathname === "/state") return json(res, 200, state);
  if (first === "ticks")
    return ticks(res, Number(url.searchParams.get("n") ?? 5), Number(url.searchParams.get("ms") ?? 200));
  if (first === "words") return words(req, res);
  if (first === "gate" && name) return gate(res, name);
  if (first === "open" && name) {
    gates.get(name)?.();
    return json(res, 200, { opened: gates.delete(name) });
  }
  if (first === "flood") return flood(res, Number(url.searchParams.get("mb") ?? 64));
  json(res, 404, { error: `no route ${url.pathname}` });
});

function json(res, status, body) {
  res.writeHead(status, { "content-type": "application/json" });
  res.end(JSON.stringify(body));
}

async function ticks(res, n, ms) {
  res.writeHead(200, { "content-type": "text/event-stream", "cache-control": "no-cache" });
  for (let i = 1; i <= n && !res.destroyed; i++) {
    res.write(`id: ${i}\nevent: tick\ndata: ${JSON.stringify({ tick: i, of: n })}\n\n`);
    if (i < n) await new Promise((r) => setTimeout(r, ms));
  }
  res.end();
}

function words(req, res) {
  const chunks = [];
  req.on("data", (c) => chunks.push(c));
  req.on("end", () => {
    res.writeHead(200, { "content-type": "application/x-ndjson" });
    const text = Buffer.concat(chunks).toString("utf8");
    for (const word of text.split(/\s+/).filter(Boolean)) res.write(JSON.stringify({ word }) + "\n");
    res.end();
  });
}

function gate(res, name) {
  res.writeHead(200, { "content-type": "text/event-stream" });
  res.write(`data: ${JSON.stringify({ waiting: name })}\n\n`);
  const opened = new Promise((resolve) => gates.set(name, resolve));
  res.on("close", () => {
    if (!res.writableFinished) state.closedEarly.push(name);
  });
  opened.then(() => res.end(`data: ${JSON.stringify({ opened: name })}\n\n`));
}

function flood(res, mb) {
  res.writeHead(200, { "content-type": "application/octet-stream" });
  const chunk = Buffer.alloc(64 * 1024, 0x61);
  const total = mb * 1024 * 1024;
  state.flooded = 0;
  const pump = () => {
    while (state.flooded < total) {
      state.flooded += chunk.length;
      if (!res.write(chunk)) return res.once("drain", pump);
    }
    res.end();
  };
  res.on("close", () => res.removeAllListeners("drain"));
  pump();
}

process.on("SIGTERM", () => server.close(() => process.exit(0)));
server.listen(Number(process.env.PORT), "127.0.0.1", () => console.log(`listening on ${process.env.PORT}`));
