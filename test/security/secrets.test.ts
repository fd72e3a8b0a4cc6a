// Project secrets attacked: a token of one project reading, listing,
// changing or deleting another's (REST and Connect); values coming back in
// an error (a malformed body, a value of the wrong type, a NUL, an oversized
// value) or in skiff's log; names that are not variable names; and names
// that steer programs (LD_PRELOAD, LD_AUDIT, PYTHONPATH, NODE_OPTIONS,
// BASH_ENV, ENV) naming host files: they must reach no process with host
// privileges (the launch script, setpriv, bwrap, the relay, the
// namespace-connect helper, the build), only the app itself. A value full of
// shell syntax reaches the app as it was written. Real skiff, real sandbox.
import { execFileSync } from "node:child_process";
import { existsSync } from "node:fs";
import { chmod, mkdir, mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { Code, ConnectError } from "@connectrpc/connect";
import { afterAll, beforeAll, describe, expect, it, vi } from "vitest";
import { packApp } from "../../services/apps/bundle.js";
import { skiffToml, writeApp } from "../helpers/apps.js";
import { capturingLogger } from "../helpers/logs.js";
import { machineCan } from "../helpers/machine.js";
import { projectWithToken, startTestSkiff, type TestSkiff } from "../helpers/skiff.js";

const VALUE = "sk_live_5f0c2b1e9d7a43c8_victim";

/** A shared object whose constructor writes who loaded it to a host file and to /tmp inside. */
const EVIL_C = (hostMarks: string) => `
#include <stdio.h>
#include <unistd.h>
__attribute__((constructor)) static void mark(void) {
  char exe[256] = "";
  ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (n > 0) exe[n] = 0;
  const char *dests[] = { "/tmp/evil-marks", "${hostMarks}" };
  for (int i = 0; i < 2; i++) {
    FILE *f = fopen(dests[i], "a");
    if (f) { fprintf(f, "uid=%d exe=%s\\n", (int)getuid(), exe); fclose(f); }
  }
}
`;

/** A Custom app (relayed, reached through the namespace-connect helper where skiff is root). */
const SERVER_PY = `
import json, os
from http.server import BaseHTTPRequestHandler, HTTPServer

class H(BaseHTTPRequestHandler):
    def do_GET(self):
        if self.path == "/env":
            body = dict(os.environ)
        elif self.path == "/marks":
            try:
                with open("/tmp/evil-marks") as f:
                    body = f.read().splitlines()
            except FileNotFoundError:
                body = []
        else:
            body = "ok"
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass

HTTPServer(("0.0.0.0", int(os.environ["PORT"])), H).serve_forever()
`;

const isRoot = process.getuid?.() === 0;
const hasCc = (() => {
  try {
    execFileSync("cc", ["--version"], { stdio: "ignore" });
    return true;
  } catch {
    return false;
  }
})();

describe("project secrets, attacked", () => {
  let t: TestSkiff;
  let tmp: string;
  let tokenA: string;
  let tokenB: string;
  const { logger, lines } = capturingLogger();

  const rest = async (method: string, p: string, token: string, body?: string) => {
    const res = await fetch(t.url + p, {
      method,
      headers: { authorization: `Bearer ${token}`, "content-type": "application/json" },
      body,
    });
    return { status: res.status, text: await res.text() };
  };

  const project = (projectId: string) => projectWithToken(t, projectId);

  beforeAll(async () => {
    tmp = await mkdtemp(path.join(tmpdir(), "skiff-secrets-attack-"));
    await chmod(tmp, 0o755);
    t = await startTestSkiff({ logger });
    tokenA = await project("p-victim");
    tokenB = await project("p-thief");
    const set = await rest("PUT", "/v2/projects/p-victim/secrets/API_KEY", tokenA, JSON.stringify({ value: VALUE }));
    expect(set.status, set.text).toBe(200);
  }, 120_000);
  afterAll(async () => {
    await t?.close();
    await rm(tmp, { recursive: true, force: true });
  });

  it("a token of one project cannot list, set or delete another's secrets (REST)", async () => {
    const theirs = "/v2/projects/p-victim/secrets";
    expect((await rest("GET", theirs, tokenB)).status).toBe(403);
    expect((await rest("PUT", `${theirs}/API_KEY`, tokenB, JSON.stringify({ value: "mine" }))).status).toBe(403);
    expect((await rest("PUT", `${theirs}/NEW`, tokenB, JSON.stringify({ value: "mine" }))).status).toBe(403);
    expect((await rest("DELETE", `${theirs}/API_KEY`, tokenB)).status).toBe(403);
    // A project id in the body that is not the path's changes nothing: the path's project is checked.
    const smuggled = await rest(
      "PUT",
      "/v2/projects/p-thief/secrets/X",
      tokenB,
      JSON.stringify({ value: "v", project_id: "p-victim" }),
    );
    expect([200, 400]).toContain(smuggled.status);
    const victims = await rest("GET", theirs, tokenA);
    expect(JSON.parse(victims.text).secrets.map((s: { name: string }) => s.name)).toEqual(["API_KEY"]);
    // Percent-encoded dots and slashes in the name name no other key.
    for (const name of ["..%2Fp-victim.API_KEY", "p-victim.API_KEY", "%2E%2E", "API_KEY%00"])
      expect((await rest("DELETE", `/v2/projects/p-thief/secrets/${name}`, tokenB)).status).toBe(404);
    expect(JSON.parse((await rest("GET", theirs, tokenA)).text).secrets).toHaveLength(1);
  });

  it("a token of one project cannot list, set or delete another's secrets (Connect)", async () => {
    const thief = t.management(tokenB);
    for (const attempt of [
      () => thief.listSecrets({ projectId: "p-victim" }),
      () => thief.setSecret({ projectId: "p-victim", name: "API_KEY", value: "mine" }),
      () => thief.deleteSecret({ projectId: "p-victim", name: "API_KEY" }),
    ]) {
      const err = await attempt().catch((e: unknown) => e);
      expect(err).toBeInstanceOf(ConnectError);
      expect((err as ConnectError).code).toBe(Code.PermissionDenied);
    }
    expect((await t.management(tokenA).listSecrets({ projectId: "p-victim" })).secrets).toHaveLength(1);
  });

  /** Bodies of a SetSecret that went wrong, each holding the value. */
  const BROKEN = [
    VALUE, // the raw value instead of JSON (curl -d "$KEY")
    `"${VALUE}"`, // a JSON string, not an object
    JSON.stringify(VALUE.slice(0, 24)), // a short one (protobuf-es quotes strings of up to 30 characters whole)
    `{"value": "${VALUE}"`, // cut JSON
    `{"value": "${VALUE}",}`, // a trailing comma
    `{"value": ["${VALUE}"]}`, // a list
    `{"value": {"key": "${VALUE}"}}`, // an object
    `{"value": "${VALUE}\u0000"}`, // a NUL
    JSON.stringify({ value: VALUE + "x".repeat(64 * 1024) }), // too large
  ];
  const leaks = (text: string) => text.includes(VALUE.slice(0, 6)) || text.includes(VALUE.slice(-8));

  it("a value never comes back in a REST error, whatever is wrong with the request, nor reaches the log", async () => {
    for (const body of BROKEN) {
      const answer = await rest("PUT", "/v2/projects/p-thief/secrets/PROBE", tokenB, body);
      expect(answer.status, body.slice(0, 60)).toBeGreaterThanOrEqual(400);
      expect(leaks(answer.text), answer.text).toBe(false);
    }
    const err = await t
      .management(tokenB)
      .setSecret({ projectId: "p-thief", name: "PROBE", value: `${VALUE}\0` })
      .catch((e: unknown) => e);
    expect((err as ConnectError).code).toBe(Code.InvalidArgument);
    expect(leaks((err as Error).message)).toBe(false);
    expect(leaks(JSON.stringify(lines))).toBe(false);
  });

  // Connect parses a body before any interceptor runs; V8's message for one that is not JSON quotes its first
  // characters ('Unexpected token 's', "sk_live_5f"...'), so Connect's JSON codec reads bodies through a check
  // of skiff's (server.ts connectJsonOptions).
  it("a value never comes back in a Connect error either", async () => {
    for (const body of BROKEN) {
      const res = await fetch(`${t.url}/skiff.management.v2.ManagementService/SetSecret`, {
        method: "POST",
        headers: { authorization: `Bearer ${tokenB}`, "content-type": "application/json" },
        body: body.startsWith("{") ? body.replace("{", '{"projectId":"p-thief","name":"PROBE",') : body,
      });
      const text = await res.text();
      expect(res.status).toBeGreaterThanOrEqual(400);
      expect(leaks(text), text).toBe(false);
      if (!body.startsWith("{") || body.endsWith(",}") || !body.endsWith("}"))
        expect(JSON.parse(text)).toMatchObject({ code: "invalid_argument", message: /^malformed JSON body/ });
    }
  });

  it("an import check (which runs the module with the project's secrets, as a replica) that prints and raises with one: neither the deployer's error nor skiff's log holds it", async () => {
    const dir = await writeApp(tmp, {
      "skiff.toml": skiffToml({ name: "leaky", runtime: { kind: "cortex", language: "python", entry: "main.py" } }),
      "main.py":
        'import os\nprint(os.environ.get("API_KEY"), flush=True)\nraise RuntimeError("key " + str(os.environ.get("API_KEY")))\n',
    });
    const err = await t
      .management(tokenA)
      .deployApp({
        projectId: "p-victim",
        bundle: { contentType: "application/gzip", data: (await packApp(dir)).bytes },
      })
      .catch((e: unknown) => e);
    expect(err).toBeInstanceOf(ConnectError);
    expect(leaks((err as Error).message)).toBe(false);
    expect(leaks(JSON.stringify(lines))).toBe(false);
  }, 120_000);

  it("names that are not variable names, or skiff's own, are refused", async () => {
    for (const name of [
      "A=B",
      "A%3DB",
      "A%0AB",
      "A%20B",
      "1A",
      "PATH",
      "PORT",
      "HOME",
      "LANG",
      "skiff_gate",
      "SKIFF_X",
    ]) {
      const answer = await rest("PUT", `/v2/projects/p-thief/secrets/${name}`, tokenB, JSON.stringify({ value: "v" }));
      expect(answer.status, name).toBe(400);
    }
    const err = await t
      .management(tokenB)
      .setSecret({ projectId: "p-thief", name: "A\nB=C", value: "v" })
      .catch((e: unknown) => e);
    expect((err as ConnectError).code).toBe(Code.InvalidArgument);
  });

  describe.skipIf(!machineCan("secrets naming host objects", isRoot && hasCc ? undefined : "they need root and cc"))(
    "secrets that steer programs",
    () => {
      it("LD_PRELOAD, LD_AUDIT, PYTHONPATH, NODE_OPTIONS, BASH_ENV, ENV naming host files reach only the app", async () => {
        const hostMarks = path.join(tmp, "host-marks");
        const hostObject = path.join(tmp, "evil.so");
        await writeFile(path.join(tmp, "evil.c"), EVIL_C(hostMarks));
        execFileSync("cc", ["-shared", "-fPIC", "-o", hostObject, path.join(tmp, "evil.c")]);
        // Python and Node code and a shell script that would mark the host if any privileged process ran them.
        const hostPy = path.join(tmp, "py");
        await mkdir(hostPy);
        await writeFile(
          path.join(hostPy, "sitecustomize.py"),
          `open(${JSON.stringify(hostMarks)}, "a").write("python\\n")\n`,
        );
        const hostJs = path.join(tmp, "evil.cjs");
        await writeFile(hostJs, `require("fs").appendFileSync(${JSON.stringify(hostMarks)}, "node\\n");\n`);
        const hostSh = path.join(tmp, "evil.sh");
        await writeFile(hostSh, `echo shell >> ${hostMarks}\n`);
        const shellText = `it's $(touch /tmp/pwned) \`id\` "q" \\ \n next; line=1 $HOME`;
        const secrets: Record<string, string> = {
          LD_PRELOAD: `${hostObject} /app/evil.so`,
          LD_AUDIT: hostObject,
          PYTHONPATH: hostPy,
          NODE_OPTIONS: `--require ${hostJs}`,
          BASH_ENV: hostSh,
          ENV: hostSh,
          SHELL_TEXT: shellText,
        };
        for (const [name, value] of Object.entries(secrets)) {
          const set = await rest("PUT", `/v2/projects/p-thief/secrets/${name}`, tokenB, JSON.stringify({ value }));
          expect(set.status, set.text).toBe(200);
        }
        const dir = await writeApp(tmp, {
          "skiff.toml": skiffToml({
            name: "steer",
            runtime: { kind: "custom", command: ["python3", "server.py"], healthcheck: "/health" },
            scaling: { min_replicas: 1 },
          }),
          "server.py": SERVER_PY,
          "requirements.txt": "",
        });
        const { readFile } = await import("node:fs/promises");
        await writeFile(path.join(dir, "evil.so"), await readFile(hostObject));
        await t.management(tokenB).deployApp({
          projectId: "p-thief",
          bundle: { contentType: "application/gzip", data: (await packApp(dir)).bytes },
        });
        const get = (p: string) => rest("GET", `/v4/p-thief/steer${p}`, tokenB);
        await vi.waitUntil(async () => (await get("/env")).status === 200, { timeout: 60_000, interval: 500 });
        const env = JSON.parse((await get("/env")).text) as Record<string, string>;
        for (const [name, value] of Object.entries(secrets)) expect(env[name], name).toBe(value);
        // The app's own object loaded in the app (the attack works where it may), as the app's uid.
        const marks = JSON.parse((await get("/marks")).text) as string[];
        expect(marks.some((m) => m.includes("python"))).toBe(true);
        for (const m of marks) expect(m).not.toMatch(/^uid=0 /);
        // Nothing outside the sandbox loaded or ran any of them.
        expect(existsSync(hostMarks)).toBe(false);
      }, 180_000);
    },
  );
});
