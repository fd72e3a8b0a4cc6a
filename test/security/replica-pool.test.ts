// The pooled hop to a replica (Replica.send, undici's Pool), attacked from
// both ends. From the app's end: an answer with a second answer after its
// Content-Length, an unsolicited answer on an idle connection, an endless
// stream of informational (1xx) heads, a head larger than any parser takes,
// chunk framing without end (an endless chunk extension, or long ones around
// bytes of body); none of them may reach the next call, and none may hold the
// runner's thread for the app's whole response_grace_period, while answers of
// many small chunks, with small extensions or without, pass whole, streamed
// or not. From the caller's end: a method, path or header carrying CR/LF to
// smuggle a second request into the kept connection; the app must see
// exactly the requests it was sent. A real app process (a raw TCP server
// speaking HTTP/1.1 as badly as it likes), unsandboxed, on 127.0.0.1.
import path from "node:path";
import { describe, expect, it } from "vitest";
import { silentLogger } from "../../services/config/logger.js";
import { freePort } from "../../services/runner/ports.js";
import { Replica, type Exchange, type ReplicaRequest } from "../../services/runner/replica.js";
import { nodeReplicaForFile } from "../helpers/node-replica.js";

/**
 * The app: reads request heads (no bodies: every request here has none) and
 * answers by path. Every request line it read is kept, for /seen to tell.
 */
const APP = `
import net from "node:net";
const seen = [];
let connections = 0;
const answer = (body, more = "") => "HTTP/1.1 200 OK\\r\\nContent-Length: " + Buffer.byteLength(body) + "\\r\\n" + more + "\\r\\n" + body;
net.createServer((socket) => {
  const id = ++connections;
  let buf = "";
  socket.on("error", () => {});
  socket.on("data", (d) => {
    buf += d.toString("latin1");
    let end;
    while ((end = buf.indexOf("\\r\\n\\r\\n")) >= 0) {
      const head = buf.slice(0, end);
      buf = buf.slice(end + 4);
      const line = head.split("\\r\\n")[0];
      const target = line.split(" ")[1] ?? "";
      if (target !== "/health") seen.push(line);
      if (target === "/health") socket.write(answer("ok"));
      else if (target === "/seen") socket.write(answer(JSON.stringify(seen)));
      else if (target === "/conn") socket.write(answer("conn " + id));
      else if (target === "/extra") socket.write(answer("first " + id) + answer("POISON"));
      else if (target === "/late") {
        socket.write(answer("first " + id));
        setTimeout(() => socket.write(answer("POISON")), 100);
      } else if (target === "/flood") {
        const heads = Buffer.from("HTTP/1.1 102 Processing\\r\\n\\r\\n".repeat(4096));
        const more = () => { while (!socket.destroyed && socket.write(heads)) {} if (!socket.destroyed) socket.once("drain", more); };
        more();
      } else if (target === "/extensions") {
        // A chunked answer whose second chunk's extension never ends: no body byte, no head, only framing.
        socket.write("HTTP/1.1 200 OK\\r\\nTransfer-Encoding: chunked\\r\\n\\r\\n1\\r\\na\\r\\n1;");
        const junk = Buffer.alloc(64 * 1024, "a");
        const more = () => { while (!socket.destroyed && socket.write(junk)) {} if (!socket.destroyed) socket.once("drain", more); };
        more();
      } else if (target === "/long-extensions") {
        // Without end, chunks of one byte of body, each with an extension of 60 KiB: framing around a body that flows.
        socket.write("HTTP/1.1 200 OK\\r\\nTransfer-Encoding: chunked\\r\\n\\r\\n");
        const chunk = Buffer.from("1;" + "a".repeat(60 * 1024) + "\\r\\nx\\r\\n");
        const more = () => { while (!socket.destroyed && socket.write(chunk)) {} if (!socket.destroyed) socket.once("drain", more); };
        more();
      } else if (target.startsWith("/chunks?")) {
        // n chunks of size bytes ("b"), each with the extension ext, written in batches as the runner reads them.
        const q = new URLSearchParams(target.slice("/chunks?".length));
        const n = Number(q.get("n")), size = Number(q.get("size")), ext = q.get("ext") ?? "";
        const frame = Buffer.concat([Buffer.from(size.toString(16) + ext + "\\r\\n"), Buffer.alloc(size, "b"), Buffer.from("\\r\\n")]);
        const batch = Buffer.concat(Array(Math.max(1, Math.floor(65536 / frame.length))).fill(frame));
        const perBatch = batch.length / frame.length;
        socket.write("HTTP/1.1 200 OK\\r\\nTransfer-Encoding: chunked\\r\\n\\r\\n");
        let sent = 0;
        const more = () => {
          while (sent < n) {
            const k = Math.min(perBatch, n - sent);
            sent += k;
            if (!socket.write(k === perBatch ? batch : batch.subarray(0, k * frame.length))) return socket.once("drain", more);
          }
          socket.write("0\\r\\nx-done: " + n + "\\r\\n\\r\\n");
        };
        more();
      } else if (target === "/trickle") {
        // A head that never ends, a byte at a time: the connection is never idle.
        socket.write("HTTP/1.1 200 OK\\r\\n");
        const timer = setInterval(() => (socket.destroyed ? clearInterval(timer) : socket.write("x")), 100);
      } else if (target === "/big-head") socket.write(answer("big", "X-Big: " + "a".repeat(256 * 1024) + "\\r\\n"));
      else socket.write(answer("echo " + target));
    }
  });
}).listen(Number(process.env.PORT), "127.0.0.1");
`;

// One connection: whatever one call leaves on it is what the next call reads.
const held = nodeReplicaForFile(APP, "hostile", 1);

function send(
  method: string,
  target: string,
  headers: Record<string, string> = {},
  onRequest: (r: ReplicaRequest) => void = () => undefined,
): Promise<Exchange> {
  return held.replica.send(method, target, { ...headers, "x-request-id": "run-1" }, new Uint8Array(0), onRequest);
}

const text = async (target: string) => (await send("GET", target)).body.toString();

/** Settles within `ms`, or rejects saying it did not. */
function within<T>(ms: number, p: Promise<T>): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  return Promise.race([
    p.finally(() => clearTimeout(timer)),
    new Promise<never>(
      (_, reject) => (timer = setTimeout(() => reject(new Error(`still pending after ${ms} ms`)), ms)),
    ),
  ]);
}

describe("an app's answers cannot poison the connection for the next call", () => {
  it("a second answer after the first's Content-Length never reaches the next call", async () => {
    expect(await text("/extra")).toMatch(/^first \d+$/);
    for (let i = 0; i < 3; i++) expect(await text(`/next-${i}`)).toBe(`echo /next-${i}`);
  });

  it("an unsolicited answer on an idle kept connection never reaches the next call", async () => {
    expect(await text("/late")).toMatch(/^first \d+$/);
    await new Promise((r) => setTimeout(r, 300));
    for (let i = 0; i < 3; i++) expect(await text(`/after-late-${i}`)).toBe(`echo /after-late-${i}`);
  });

  it("a head larger than the parser takes fails that call only", async () => {
    await expect(send("GET", "/big-head")).rejects.toThrow();
    expect(await text("/after-big-head")).toBe("echo /after-big-head");
  });

  /**
   * Calls `path`, whose answer the runner's thread would parse without end: the call fails at once with an error
   * matching `why` (its caller would otherwise wait until response_grace_period, up to 12 hours), and the pool
   * serves the next call.
   */
  async function failsAtOnce(path: string, why: RegExp): Promise<void> {
    let request: ReplicaRequest | undefined;
    const started = Date.now();
    try {
      await expect(
        within(
          5_000,
          send("GET", path, {}, (r) => (request = r)),
        ),
      ).rejects.toThrow(why);
    } finally {
      request?.destroy(); // what its caller would do at response_grace_period
    }
    expect(Date.now() - started).toBeLessThan(2_000);
    expect(await text(`/after${path}`)).toBe(`echo /after${path}`);
  }

  it("an endless stream of informational heads fails the call at once instead of holding the runner's thread", async () => {
    // Each 1xx head is parsed and handed to the runner's handler on its main thread; with no final answer coming,
    // nothing else bounds it but response_grace_period (up to 12 hours), while the app's writes never wait.
    await failsAtOnce("/flood", /informational/);
  });

  it("an answer whose framing never ends (an endless chunk extension) fails the call at once", async () => {
    // A chunk extension is framing, which undici parses on the runner's thread and never hands to the handler:
    // neither the 1xx cap nor the answer's byte cap sees it, and with no body byte arriving nothing pauses the
    // read (one such answer took over half the runner's thread until response_grace_period). What each pooled
    // connection reads is counted against what its exchange delivered; past MAX_FRAMING_BYTES the call fails
    // and the connection is closed.
    await failsAtOnce("/extensions", /framing/);
  });

  it("an answer whose long chunk extensions surround bytes of body fails the call at once too", async () => {
    // Each byte of body allows its chunk a little framing (FRAMING_BYTES_PER_CHUNK), not a fresh MAX_FRAMING_BYTES.
    await failsAtOnce("/long-extensions", /framing/);
  });
});

describe("legitimate chunked answers pass, however many chunks and however long", () => {
  // Their framing together is well past MAX_FRAMING_BYTES: what bounds it is framing per piece of body.
  it.each([
    ["without extensions, 250,000 chunks of 64 bytes", 250_000, 64, ""],
    ["with small extensions, 250,000 chunks of 64 bytes", 250_000, 64, ";name=" + "v".repeat(40)],
    ["with small extensions, 64 chunks of 128 KiB", 64, 128 * 1024, ";sig=" + "0123456789abcdef".repeat(8)],
  ])("whole: %s", async (_, n, size, ext) => {
    const ex = await within(20_000, send("GET", `/chunks?n=${n}&size=${size}&ext=${encodeURIComponent(ext)}`));
    expect(ex.status).toBe(200);
    expect(ex.body.byteLength).toBe(n * size);
    expect(ex.body.equals(Buffer.alloc(n * size, "b"))).toBe(true);
    expect(await text("/after-chunks")).toBe("echo /after-chunks");
  });

  it("streamed at a slow reader's pace: 400,000 small chunks with extensions, whole, with their trailers", async () => {
    const n = 400_000;
    const size = 16;
    const ex = await held.replica.send(
      "GET",
      `/chunks?n=${n}&size=${size}&ext=${encodeURIComponent(";i=1")}`,
      { "x-request-id": "run-1" },
      new Uint8Array(0),
      () => undefined,
      true,
    );
    expect(ex.stream).toBeDefined();
    const read = async () => {
      let bytes = 0;
      let wrong = 0;
      let sincePause = 0;
      for await (const chunk of ex.stream! as AsyncIterable<Buffer>) {
        bytes += chunk.byteLength;
        for (const b of chunk) if (b !== 0x62) wrong++;
        // The reader stops now and then: the answer waits in the connection, the parser paused.
        if ((sincePause += chunk.byteLength) >= 512 * 1024) {
          sincePause = 0;
          await new Promise((r) => setTimeout(r, 50));
        }
      }
      return { bytes, wrong };
    };
    expect(await within(30_000, read())).toEqual({ bytes: n * size, wrong: 0 });
    expect(ex.stream!.trailers).toEqual({ "x-done": String(n) });
    expect(await text("/after-stream")).toBe("echo /after-stream");
  });
});

describe("a caller cannot smuggle a second request into the kept connection", () => {
  const SMUGGLED = "GET /smuggled HTTP/1.1";

  it.each([
    ["a header value", () => send("GET", "/h", { "x-a": `1\r\n\r\n${SMUGGLED}\r\nx-b: 2` })],
    ["a header value with a bare LF", () => send("GET", "/h", { "x-a": `1\n\n${SMUGGLED}\nx-b: 2` })],
    ["a header name", () => send("GET", "/h", { [`x-a: 1\r\n\r\n${SMUGGLED}\r\nx-b`]: "2" })],
    ["the path", () => send("GET", `/p HTTP/1.1\r\nHost: x\r\n\r\n${SMUGGLED}\r\nX-c: `)],
    ["the method", () => send(`GET /m HTTP/1.1\r\nHost: x\r\n\r\n${SMUGGLED}\r\nX-d:`, "/m")],
    ["a Transfer-Encoding beside a Content-Length", () => send("GET", "/te", { "transfer-encoding": "chunked" })],
  ])("through %s", async (_, attempt) => {
    await attempt().catch(() => undefined);
    const seen = JSON.parse(await text("/seen")) as string[];
    expect(seen.filter((line) => line.includes("/smuggled"))).toEqual([]);
    expect(await text("/after")).toBe("echo /after");
  });
});

describe("a request that cannot be sent", () => {
  it("refused while another call holds the only connection, leaves the pool serving the next calls", async () => {
    let busy: ReplicaRequest | undefined;
    const holding = send("GET", "/trickle", {}, (r) => (busy = r)).catch(() => undefined);
    await new Promise((r) => setTimeout(r, 100));
    await expect(send("GET", "/h", { "x-a": "1\r\nx-b: 2" })).rejects.toThrow();
    busy?.destroy();
    await holding;
    expect(await within(5_000, text("/after-refusal"))).toBe("echo /after-refusal");
  });
});

describe("an app's answers to health probes cannot hold them past their timeout", () => {
  it("a probe answered a byte at a time gets no status within its timeout", async () => {
    const started = Date.now();
    expect(await within(3_000, held.replica.probe("/trickle", 500))).toBe(0);
    expect(Date.now() - started).toBeLessThan(1_500);
  });

  it("a probe answered with endless informational heads gets no status within its timeout", async () => {
    const started = Date.now();
    expect(await within(3_000, held.replica.probe("/flood", 500))).toBe(0);
    expect(Date.now() - started).toBeLessThan(1_500);
  });

  it("a replica whose healthcheck floods informational heads fails its start by its start timeout", async () => {
    const flooding = new Replica(
      {
        ...held.replica.spec,
        replicaId: "r2",
        workDir: path.join(held.tmp, "work2"),
        port: await freePort(),
        healthcheck: "/flood",
        startTimeoutMs: 1_000,
      },
      { agent: held.agent, logger: silentLogger, onExit: () => undefined },
    );
    try {
      await expect(within(4_000, flooding.start())).rejects.toThrow(/did not answer 200/);
    } finally {
      await flooding.stop(1_000);
    }
  });
});
