// One HTTP/1.1 exchange over a raw socket: the request's bytes exactly as
// given, and the answer read with a small parser (status, headers, body by
// Content-Length, chunked, or up to the close). Resolves with the answer, or
// with `closed` when the server closed the connection without one; never
// waits on a timer of its own: the server's deadlines end every connection.
import net from "node:net";

export interface RawAnswer {
  status: number;
  headers: Map<string, string>;
  body: Buffer;
}

export function exchange(port: number, request: Buffer, head = false): Promise<RawAnswer | "closed"> {
  return new Promise((resolve, reject) => {
    const socket = net.connect(port, "127.0.0.1");
    let data = Buffer.alloc(0);
    let done = false;
    const finish = (answer: RawAnswer | "closed") => {
      if (done) return;
      done = true;
      socket.destroy();
      resolve(answer);
    };
    /** The answer, once complete; undefined while more bytes are needed. */
    const parse = (ended: boolean): RawAnswer | undefined => {
      for (;;) {
        const end = data.indexOf("\r\n\r\n");
        if (end === -1) return undefined;
        const lines = data.subarray(0, end).toString("latin1").split("\r\n");
        const status = Number(/^HTTP\/1\.[01] (\d{3})/.exec(lines[0])?.[1]);
        if (!Number.isInteger(status)) throw new Error(`not an HTTP answer: ${JSON.stringify(lines[0])}`);
        const headers = new Map<string, string>();
        for (const line of lines.slice(1)) {
          const colon = line.indexOf(":");
          headers.set(line.slice(0, colon).trim().toLowerCase(), line.slice(colon + 1).trim());
        }
        const rest = data.subarray(end + 4);
        // An interim answer (100 Continue): the real one follows.
        if (status >= 100 && status < 200) {
          data = rest;
          continue;
        }
        if (head || status === 204 || status === 304) return { status, headers, body: Buffer.alloc(0) };
        const length = headers.get("content-length");
        if (length !== undefined) {
          const n = Number(length);
          return rest.length >= n ? { status, headers, body: rest.subarray(0, n) } : undefined;
        }
        if (/chunked/i.test(headers.get("transfer-encoding") ?? "")) {
          const chunks: Buffer[] = [];
          let at = 0;
          for (;;) {
            const lineEnd = rest.indexOf("\r\n", at);
            if (lineEnd === -1) return undefined;
            const size = parseInt(rest.subarray(at, lineEnd).toString("latin1"), 16);
            if (size === 0) return { status, headers, body: Buffer.concat(chunks) };
            if (rest.length < lineEnd + 2 + size + 2) return undefined;
            chunks.push(rest.subarray(lineEnd + 2, lineEnd + 2 + size));
            at = lineEnd + 2 + size + 2;
          }
        }
        return ended ? { status, headers, body: rest } : undefined;
      }
    };
    socket.on("data", (chunk: Buffer) => {
      data = Buffer.concat([data, chunk]);
      try {
        const answer = parse(false);
        if (answer) finish(answer);
      } catch (err) {
        done = true;
        socket.destroy();
        reject(err);
      }
    });
    const closed = () => {
      try {
        finish(parse(true) ?? "closed");
      } catch (err) {
        done = true;
        reject(err);
      }
    };
    socket.on("end", closed);
    socket.on("close", closed);
    // The server may answer and close before it has read everything sent.
    socket.on("error", (err: NodeJS.ErrnoException) => {
      if (err.code !== "ECONNRESET" && err.code !== "EPIPE") {
        done = true;
        reject(err);
      }
    });
    socket.write(request);
  });
}
