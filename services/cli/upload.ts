// Uploading a bundle to `POST /v2/projects/{project}/apps` with node:http
// rather than the Connect client, so that the bytes written can be counted
// for the progress bar. Errors come back as the ConnectError the server
// answered (`{"code", "message"}`), so they print like any other command's.
import http from "node:http";
import https from "node:https";
import { Code, ConnectError } from "@connectrpc/connect";
import { codeFromString } from "@connectrpc/connect/protocol-connect";

const CHUNK_BYTES = 64 * 1024;

interface UploadOptions {
  url: string;
  token: string;
  projectId: string;
  bytes: Buffer;
  /** Called as bytes are handed to the socket. */
  onProgress: (sent: number, total: number) => void;
}

/** Sends the bundle; resolves with the JSON of the DeployAppResponse. */
export function uploadBundle(opts: UploadOptions): Promise<unknown> {
  const url = new URL(`${opts.url}/v2/projects/${encodeURIComponent(opts.projectId)}/apps`);
  const client = url.protocol === "https:" ? https : http;
  return new Promise((resolve, reject) => {
    const req = client.request(url, {
      method: "POST",
      headers: {
        "content-type": "application/gzip",
        "content-length": String(opts.bytes.length),
        authorization: `Bearer ${opts.token}`,
      },
    });
    req.on("error", (err) => reject(new ConnectError(err.message, Code.Unavailable, undefined, undefined, err)));
    req.on("response", (res) => {
      const chunks: Buffer[] = [];
      res.on("data", (c: Buffer) => chunks.push(c));
      res.on("error", (err) => reject(new ConnectError(err.message, Code.Unavailable, undefined, undefined, err)));
      res.on("end", () => {
        const text = Buffer.concat(chunks).toString("utf8");
        let body: { code?: unknown; message?: unknown } | undefined;
        try {
          body = JSON.parse(text) as typeof body;
        } catch {
          body = undefined;
        }
        if (res.statusCode === 200 && body) return resolve(body);
        const code = typeof body?.code === "string" ? codeFromString(body.code) : undefined;
        const message =
          typeof body?.message === "string" ? body.message : `HTTP ${res.statusCode}: ${text.slice(0, 500)}`;
        reject(new ConnectError(message, code ?? Code.Unknown));
      });
    });
    // Written a chunk at a time, the next one once the socket took the last:
    // the count is what actually left this process.
    let sent = 0;
    const next = () => {
      if (sent >= opts.bytes.length) return req.end();
      const chunk = opts.bytes.subarray(sent, sent + CHUNK_BYTES);
      req.write(chunk, (err) => {
        if (err) return;
        sent += chunk.length;
        opts.onProgress(sent, opts.bytes.length);
        next();
      });
    };
    next();
  });
}

/** A progress bar for stderr: redrawn in place on a terminal, a start and an end line otherwise. */
export function progressBar(
  write: (text: string) => void,
  isTty: boolean,
  label: string,
): (sent: number, total: number) => void {
  let lastShown = -1;
  const size = (n: number) =>
    n >= 1024 * 1024 ? `${(n / 1024 / 1024).toFixed(1)} MiB` : `${(n / 1024).toFixed(1)} KiB`;
  return (sent, total) => {
    const pct = total === 0 ? 100 : Math.floor((sent / total) * 100);
    if (pct === lastShown) return;
    if (!isTty) {
      if (lastShown === -1 || pct === 100) write(`${label} ${size(sent)} of ${size(total)} (${pct}%)\n`);
    } else {
      const width = 30;
      const done = Math.round((pct / 100) * width);
      write(
        `\r${label} [${"=".repeat(done)}${" ".repeat(width - done)}] ${String(pct).padStart(3)}% ${size(sent)}/${size(total)}${pct === 100 ? "\n" : ""}`,
      );
    }
    lastShown = pct;
  };
}
