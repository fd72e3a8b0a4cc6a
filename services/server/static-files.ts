// Serves a built single-page app (the dashboard) from a folder, for the GET
// and HEAD requests that are not API calls. A path that names no file and
// has no extension is a route of the app: it gets index.html, which the app's
// router reads. Hashed assets (Vite writes them under assets/ with the
// content hash in the name) are cached for a year; index.html is revalidated
// on every load so a new build is picked up at once.
//
// The folder is looked up per request, not at start: building the dashboard
// while skiff runs makes it appear without a restart, and a missing build
// answers a 503 page that says how to make one.
import { createReadStream } from "node:fs";
import { stat } from "node:fs/promises";
import path from "node:path";
import type { NodeHandler } from "./rest/transcoder.js";

/** The server's fallback handler type: plain Node requests, HTTP/1.1 or HTTP/2. */
export type StaticHandler = NodeHandler;
type NodeRequest = Parameters<NodeHandler>[0];
type NodeResponse = Parameters<NodeHandler>[1];

/**
 * Paths that belong to the API and never to the app: the REST versions
 * (`/v2/…`, `/v4/…`, and any other `/v{n}` so an unknown version stays a JSON
 * 404), the probes, and the Connect/gRPC service paths.
 */
export function isApiPath(urlPath: string): boolean {
  return (
    /^\/v\d+(\/|$)/.test(urlPath) ||
    urlPath === "/healthz" ||
    urlPath === "/readyz" ||
    urlPath === "/metrics" ||
    urlPath.startsWith("/skiff.") ||
    urlPath.startsWith("/grpc.")
  );
}

const CONTENT_TYPES: Record<string, string> = {
  ".html": "text/html; charset=utf-8",
  ".js": "text/javascript; charset=utf-8",
  ".mjs": "text/javascript; charset=utf-8",
  ".css": "text/css; charset=utf-8",
  ".json": "application/json",
  ".map": "application/json",
  ".svg": "image/svg+xml",
  ".png": "image/png",
  ".ico": "image/x-icon",
  ".txt": "text/plain; charset=utf-8",
  ".woff2": "font/woff2",
};

const IMMUTABLE = "public, max-age=31536000, immutable";
const REVALIDATE = "no-cache";

/**
 * Sent with every answer: the app loads nothing from elsewhere and is never
 * framed, which keeps a pasted token away from other origins.
 */
const SECURITY_HEADERS = {
  "content-security-policy":
    "default-src 'self'; img-src 'self' data:; style-src 'self'; object-src 'none'; base-uri 'none'; frame-ancestors 'none'",
  "x-content-type-options": "nosniff",
  "x-frame-options": "DENY",
  "referrer-policy": "no-referrer",
};

/** The 503 page is one self-contained document with inline styles, and nothing else. */
const NOT_BUILT_HEADERS = {
  "content-type": CONTENT_TYPES[".html"],
  "cache-control": "no-store",
  "content-security-policy": "default-src 'none'; style-src 'unsafe-inline'; frame-ancestors 'none'",
};

function notBuiltPage(command: string): string {
  return `<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>skiff: dashboard not built</title></head>
<body style="font-family: system-ui, sans-serif; max-width: 40rem; margin: 4rem auto; line-height: 1.5">
<h1>The dashboard is not built</h1>
<p>This skiff serves its API, but the dashboard's files are missing. Build them once, then reload this page:</p>
<pre style="background:#f3f4f6;padding:1rem">${command}</pre>
<p><code>npm start</code> builds it on its own before starting.</p>
</body></html>
`;
}

function send(
  res: NodeResponse,
  status: number,
  headers: Record<string, string | number>,
  body: string,
  head: boolean,
): void {
  res.writeHead(status, { ...SECURITY_HEADERS, ...headers, "content-length": Buffer.byteLength(body) });
  if (head) res.end();
  else res.end(body);
}

/** The file a URL path names inside root, or undefined when it would leave root or is not a clean path. */
export function resolveInside(root: string, urlPath: string): string | undefined {
  let decoded: string;
  try {
    decoded = decodeURIComponent(urlPath);
  } catch {
    return undefined;
  }
  // A backslash or NUL has no business in a file path of the app; both are tricks on some systems.
  if (decoded.includes("\0") || decoded.includes("\\")) return undefined;
  const segments = decoded.split("/");
  if (segments.some((s) => s === ".." || s === ".")) return undefined;
  const file = path.join(root, ...segments.filter((s) => s !== ""));
  return file === root || file.startsWith(root + path.sep) ? file : undefined;
}

async function isFile(file: string): Promise<{ size: number; mtime: Date } | undefined> {
  try {
    const s = await stat(file);
    return s.isFile() ? s : undefined;
  } catch {
    return undefined;
  }
}

export interface StaticFilesOptions {
  /** The built app, e.g. services/dashboard/dist. */
  root: string;
  /** Shown on the 503 page when root has no index.html. */
  buildCommand: string;
}

export function createStaticFiles(opts: StaticFilesOptions): StaticHandler {
  const root = path.resolve(opts.root);
  const index = path.join(root, "index.html");

  async function serve(req: NodeRequest, res: NodeResponse): Promise<void> {
    const head = req.method === "HEAD";
    const urlPath = (req.url ?? "/").split("?", 1)[0];
    const indexStat = await isFile(index);
    if (!indexStat) return send(res, 503, NOT_BUILT_HEADERS, notBuiltPage(opts.buildCommand), head);

    const file = resolveInside(root, urlPath);
    if (file === undefined) return send(res, 400, { "content-type": CONTENT_TYPES[".txt"] }, "bad path\n", head);
    const ext = path.extname(file);
    const found = file === root ? undefined : await isFile(file);
    // A missing file with an extension is a broken link (an old asset), not a route of the app.
    if (!found && ext !== "")
      return send(
        res,
        404,
        { "content-type": CONTENT_TYPES[".txt"], "cache-control": "no-store" },
        "not found\n",
        head,
      );

    const [target, s] = found ? [file, found] : [index, indexStat];
    const hashed = found !== undefined && path.relative(root, file).startsWith(`assets${path.sep}`);
    res.writeHead(200, {
      ...SECURITY_HEADERS,
      "content-type": CONTENT_TYPES[path.extname(target)] ?? "application/octet-stream",
      "content-length": s.size,
      "last-modified": s.mtime.toUTCString(),
      "cache-control": hashed ? IMMUTABLE : REVALIDATE,
    });
    if (head) {
      res.end();
      return;
    }
    const stream = createReadStream(target);
    stream.on("error", () => res.destroy());
    stream.pipe(res as NodeJS.WritableStream);
  }

  return (req, res) => {
    serve(req, res).catch(() => {
      if (!res.headersSent)
        send(res, 500, { "content-type": CONTENT_TYPES[".txt"] }, "cannot read the dashboard's files\n", false);
      else res.destroy();
    });
  };
}
