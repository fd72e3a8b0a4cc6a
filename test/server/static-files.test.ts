// The dashboard's static files on the one port: SPA routes, content types,
// caching, no path traversal, the 503 page before a build, and API paths
// left to the API.
import { mkdir, mkdtemp, rm, writeFile } from "node:fs/promises";
import http from "node:http";
import type { AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import path from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createStaticFiles, isApiPath, resolveInside } from "../../services/server/static-files.js";

let dir: string;
let site: string;
let server: http.Server;
let url: string;

beforeAll(async () => {
  dir = await mkdtemp(path.join(tmpdir(), "skiff-static-"));
  site = path.join(dir, "site");
  await mkdir(path.join(site, "assets"), { recursive: true });
  await writeFile(path.join(site, "index.html"), "<!doctype html><title>app</title>");
  await writeFile(path.join(site, "assets", "index-abc123.js"), "console.log(1)");
  await writeFile(path.join(site, "assets", "index-abc123.css"), "body{}");
  await writeFile(path.join(site, "favicon.svg"), "<svg/>");
  await writeFile(path.join(dir, "secret.txt"), "outside the site");
  const handler = createStaticFiles({ root: site, buildCommand: "npm run build:dashboard" });
  server = http.createServer((req, res) => handler(req, res));
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
});
afterAll(async () => {
  await new Promise((r) => server?.close(r));
  await rm(dir, { recursive: true, force: true });
});

/** A raw request, so paths reach the server exactly as written (fetch would normalise `..`). */
function get(
  pathname: string,
  method = "GET",
): Promise<{ status: number; headers: http.IncomingHttpHeaders; body: string }> {
  return new Promise((resolve, reject) => {
    const req = http.request(url + "/", { method, path: pathname }, (res) => {
      let body = "";
      res.on("data", (c) => (body += c));
      res.on("end", () => resolve({ status: res.statusCode!, headers: res.headers, body }));
    });
    req.on("error", reject);
    req.end();
  });
}

describe("static files - the dashboard's assets", () => {
  it("/ and any route of the app answer index.html, revalidated on every load", async () => {
    for (const p of ["/", "/projects/p-dev/runs", "/projects/p-dev/apps/x/runs/123?app=x"]) {
      const res = await get(p);
      expect(res.status, p).toBe(200);
      expect(res.headers["content-type"], p).toBe("text/html; charset=utf-8");
      expect(res.headers["cache-control"], p).toBe("no-cache");
      expect(res.body).toContain("<title>app</title>");
    }
  });

  it("hashed assets carry their content type and a year of immutable caching; other files are revalidated", async () => {
    const js = await get("/assets/index-abc123.js");
    expect(js).toMatchObject({ status: 200, body: "console.log(1)" });
    expect(js.headers["content-type"]).toBe("text/javascript; charset=utf-8");
    expect(js.headers["cache-control"]).toBe("public, max-age=31536000, immutable");
    expect((await get("/assets/index-abc123.css")).headers["content-type"]).toBe("text/css; charset=utf-8");
    const svg = await get("/favicon.svg");
    expect(svg.headers["content-type"]).toBe("image/svg+xml");
    expect(svg.headers["cache-control"]).toBe("no-cache");
  });

  it("every answer forbids framing and outside resources", async () => {
    const res = await get("/");
    expect(res.headers["content-security-policy"]).toContain("default-src 'self'");
    expect(res.headers["x-frame-options"]).toBe("DENY");
    expect(res.headers["x-content-type-options"]).toBe("nosniff");
  });

  it("HEAD answers the headers of GET without a body", async () => {
    const res = await get("/assets/index-abc123.js", "HEAD");
    expect(res.status).toBe(200);
    expect(res.headers["content-length"]).toBe(String("console.log(1)".length));
    expect(res.body).toBe("");
  });

  it("a missing file with an extension is 404, not the app", async () => {
    const res = await get("/assets/index-old999.js");
    expect(res.status).toBe(404);
    expect(res.body).not.toContain("<title>app</title>");
  });

  it.each([
    "/../secret.txt",
    "/assets/../../secret.txt",
    "/%2e%2e/secret.txt",
    "/assets/%2e%2e%2f%2e%2e%2fsecret.txt",
    "/..%5csecret.txt",
    "/%00",
    "/%zz",
  ])("%s never leaves the folder", async (p) => {
    const res = await get(p);
    expect(res.status).toBe(400);
    expect(res.body).not.toContain("outside the site");
  });

  it("resolveInside keeps every path inside the root", () => {
    expect(resolveInside("/srv/site", "/a/b.js")).toBe(path.join("/srv/site", "a", "b.js"));
    expect(resolveInside("/srv/site", "/")).toBe("/srv/site");
    expect(resolveInside("/srv/site", "/a/../../etc/passwd")).toBeUndefined();
    expect(resolveInside("/srv/site", "/a/./b")).toBeUndefined();
  });

  it("without a build, every page is a 503 that says how to build it", async () => {
    const handler = createStaticFiles({ root: path.join(dir, "not-built"), buildCommand: "npm run build:dashboard" });
    const other = http.createServer((req, res) => handler(req, res));
    await new Promise<void>((r) => other.listen(0, "127.0.0.1", r));
    try {
      const res = await fetch(`http://127.0.0.1:${(other.address() as AddressInfo).port}/projects/p-dev/runs`);
      expect(res.status).toBe(503);
      expect(res.headers.get("content-type")).toBe("text/html; charset=utf-8");
      const text = await res.text();
      expect(text).toContain("The dashboard is not built");
      expect(text).toContain("npm run build:dashboard");
    } finally {
      await new Promise((r) => other.close(r));
    }
  });
});

describe("static files - API paths stay the API's", () => {
  it.each([
    ["/v2/projects", true],
    ["/v4/p-dev/hello/run", true],
    ["/v3/nothing", true],
    ["/v2", true],
    ["/healthz", true],
    ["/readyz", true],
    ["/skiff.management.v2.ManagementService/GetIdentity", true],
    ["/grpc.health.v1.Health/Check", true],
    ["/", false],
    ["/projects/p-dev/runs", false],
    ["/assets/index-abc.js", false],
    ["/variables", false],
  ])("%s is an API path: %s", (p, api) => {
    expect(isApiPath(p)).toBe(api);
  });
});
