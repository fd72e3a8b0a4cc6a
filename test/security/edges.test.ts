// An outsider's attacks on five edges of boundaries kept elsewhere:
// - CreateProject has no project scope check in the auth interceptor (its
//   handler refuses all but the admin token): a service account tries to
//   make, overwrite or touch projects through every transport, and every
//   other method that names a project must still be scope-checked;
// - tokens whose signature is not canonical base64url are refused: other
//   spellings of a token, the token cache, and tokens the server issues;
// - the CLI sends a data folder's admin token only to that folder's skiff:
//   SKIFF_HOST / SKIFF_PORT tricks, several data folders, odd address files;
// - the sandbox gate starts with `unset PWD`: [env] and secret names and
//   values as shell text, and the gate's refusal when it is not released;
// - the example event consumer finds its nats-server from the ports files in
//   the data folder and authenticates with skiff's nkey: a ports file left by
//   a server that died (its pid since reused) steers it elsewhere.
import { spawn, type ChildProcess } from "node:child_process";
import { chmod, mkdir, mkdtemp, open, readFile, rm, stat, writeFile } from "node:fs/promises";
import net from "node:net";
import { tmpdir } from "node:os";
import path from "node:path";
import type { DescMethod, DescService } from "@bufbuild/protobuf";
import { timestampFromDate } from "@bufbuild/protobuf/wkt";
import { Code, ConnectError, createClient, type Transport } from "@connectrpc/connect";
import { createConnectTransport, createGrpcTransport, createGrpcWebTransport } from "@connectrpc/connect-node";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { InvocationService } from "../../gen/skiff/invocation/v4/invocation_pb.js";
import { ManagementService } from "../../gen/skiff/management/v2/management_pb.js";
import { SKIFF_APIS } from "../../services/apis.js";
import { parseAppConfig } from "../../services/apps/app-config.js";
import { issueToken, newEd25519Key, signingKeyFrom, verifyToken } from "../../services/auth/tokens.js";
import { resolveTarget, type Target } from "../../services/cli/defaults.js";
import { silentLogger } from "../../services/config/logger.js";
import { connectNats, provision } from "../../services/nats/index.js";
import { gateText, sandboxArgv } from "../../services/runner/sandbox-argv.js";
import { secretNameProblem } from "../../services/secrets/names.js";
import { DEFAULT_SANDBOX_LIMITS, defaultSandbox, spawnSandboxed } from "../../services/runner/sandbox.js";
import { skiffToml } from "../helpers/apps.js";
import { bearer, startTestSkiff, type TestSkiff } from "../helpers/skiff.js";

const DAY_MS = 24 * 3600 * 1000;
const VICTIM = "p-victim";
const ROOT = path.resolve(import.meta.dirname, "../..");

// ---------------------------------------------------------------------------
// 1 and 2: a whole skiff.

describe("a running skiff: CreateProject's scope and token spellings", () => {
  let t: TestSkiff;
  let before: { projectId: string; name: string; createdAt: bigint | undefined }[];

  const transports = (token: string): Record<string, Transport> => ({
    connect: createConnectTransport({ baseUrl: t.url, httpVersion: "1.1", interceptors: [bearer(token)] }),
    grpc: createGrpcTransport({ baseUrl: t.url, interceptors: [bearer(token)] }),
    grpcWeb: createGrpcWebTransport({ baseUrl: t.url, httpVersion: "1.1", interceptors: [bearer(token)] }),
  });

  const projects = async () =>
    (await t.management().listProjects({})).projects
      .map((p) => ({ projectId: p.projectId, name: p.name, createdAt: p.createdAt?.seconds }))
      .sort((a, b) => a.projectId.localeCompare(b.projectId));

  const rest = async (method: string, p: string, token: string | undefined, body?: string) => {
    const res = await fetch(t.url + p, {
      method,
      headers: {
        ...(body === undefined ? {} : { "content-type": "application/json" }),
        ...(token === undefined ? {} : { authorization: `Bearer ${token}` }),
      },
      body,
    });
    return { status: res.status, text: await res.text() };
  };

  beforeAll(async () => {
    t = await startTestSkiff();
    await t.management().createProject({ projectId: VICTIM, name: "victim's" });
    before = await projects();
  }, 60_000);

  afterAll(async () => {
    await t?.close();
  });

  describe("CreateProject without its scope check in the interceptor", () => {
    it("a service account cannot create, re-create or rename a project through Connect, gRPC or gRPC-Web", async () => {
      const ids = [VICTIM, "p-dev", "p-fresh", "", "P-VICTIM", " p-victim", "p-victim\u0000", "p-dev/../p-victim"];
      for (const [kind, transport] of Object.entries(transports(t.devToken))) {
        const client = createClient(ManagementService, transport);
        for (const projectId of ids)
          for (const name of ["", "taken over"]) {
            const err = await client.createProject({ projectId, name }).then(
              (res) => res,
              (e: unknown) => e,
            );
            expect(err, `${kind} ${JSON.stringify(projectId)}`).toBeInstanceOf(ConnectError);
            expect(err, `${kind} ${JSON.stringify(projectId)}`).toMatchObject({
              code: Code.PermissionDenied,
              rawMessage: "only the admin token can create projects",
            });
          }
      }
      expect(await projects()).toEqual(before);
    });

    it("REST POST /v2/projects with a service account token: 403 for every body (unknown fields, duplicate keys, casing)", async () => {
      const bodies = [
        `{"project_id":"p-rest1"}`,
        `{"projectId":"p-rest2"}`,
        `{"project_id":"${VICTIM}","name":"taken over"}`,
        `{"project_id":"p-dev","project_id":"p-rest3"}`,
        `{"project_id":"p-rest4","projectId":"p-dev"}`,
        `{"project_id":"p-rest5","project":{"project_id":"p-dev"},"service_account_id":"sa-dev","kind":"admin"}`,
        `{"PROJECT_ID":"p-rest6"}`,
        `{"project_id":"p-rest7","__proto__":{"kind":"admin"}}`,
        `{}`,
      ];
      const statuses: number[] = [];
      for (const body of bodies) {
        const res = await rest("POST", "/v2/projects", t.devToken, body);
        statuses.push(res.status);
        // An unknown field may be a 400 before the handler; never a success.
        expect([400, 403], `${body}: ${res.status} ${res.text}`).toContain(res.status);
        if (res.status === 403) expect(res.text).toContain("only the admin token can create projects");
      }
      // The handler itself answered the well-formed ones.
      expect(statuses.filter((x) => x === 403).length).toBeGreaterThanOrEqual(5);
      expect(await projects()).toEqual(before);
    });

    it("REST odd paths and methods to CreateProject never create a project for a service account", async () => {
      const paths = [
        "/v2/projects/",
        "/V2/projects",
        "/v2/PROJECTS",
        "/v2//projects",
        "/v2/projects?project_id=p-dev",
        "/v2/projects?projectId=p-odd1",
        "/v2/projects;x",
        "/v2/projects%2F",
        "/v2/./projects",
        "/v2/projects/p-dev/../../projects",
        "/v2/projects:create",
        "/skiff.management.v2.ManagementService/CreateProject",
        "/skiff.management.v2.ManagementService/createProject",
        "/skiff.management.v2.managementservice/CreateProject",
        "/SKIFF.MANAGEMENT.V2.MANAGEMENTSERVICE/CREATEPROJECT",
        "//skiff.management.v2.ManagementService/CreateProject",
      ];
      for (const p of paths)
        for (const method of ["POST", "PUT", "PATCH"]) {
          const res = await rest(method, p, t.devToken, `{"project_id":"p-odd2","name":"x"}`);
          expect(res.status, `${method} ${p}: ${res.text}`).not.toBe(200);
          expect(res.status, `${method} ${p}`).toBeGreaterThanOrEqual(400);
        }
      // Connect's GET form (only for side-effect-free methods).
      const message = encodeURIComponent(JSON.stringify({ projectId: "p-odd3" }));
      const get = await rest(
        "GET",
        `/skiff.management.v2.ManagementService/CreateProject?connect=v1&encoding=json&message=${message}`,
        t.devToken,
      );
      expect(get.status).toBeGreaterThanOrEqual(400);
      expect(await projects()).toEqual(before);
    });

    it("a service account cannot delete its own project (a method whose handler, not the interceptor, keeps admins apart)", async () => {
      for (const transport of Object.values(transports(t.devToken)))
        await expect(
          createClient(ManagementService, transport).deleteProject({ projectId: "p-dev" }),
        ).rejects.toMatchObject({
          code: Code.PermissionDenied,
        });
      const res = await rest("DELETE", "/v2/projects/p-dev", t.devToken);
      expect(res.status).toBe(403);
      expect(await projects()).toEqual(before);
    });

    it("only ManagementService has a method named CreateProject (the interceptor leaves that one method to its handler)", () => {
      const named = SKIFF_APIS.flatMap((api) => api.services).flatMap((s: DescService) =>
        s.methods.filter((m) => m.name.toLowerCase() === "createproject").map((m) => `${s.typeName}/${m.name}`),
      );
      expect(named).toEqual(["skiff.management.v2.ManagementService/CreateProject"]);
    });

    it("every other method with a project_id is still scope-checked: another project's id is refused before its handler", async () => {
      const checked: string[] = [];
      for (const service of [ManagementService, InvocationService] as DescService[]) {
        for (const method of service.methods as DescMethod[]) {
          if (method.name === "CreateProject") continue;
          if (!method.input.fields.some((f) => f.name === "project_id")) continue;
          for (const [kind, transport] of Object.entries(transports(t.devToken))) {
            const client = createClient(service, transport) as unknown as Record<
              string,
              (req: Record<string, unknown>) => Promise<unknown> | AsyncIterable<unknown>
            >;
            const call = async () => {
              const res = client[method.localName]({ projectId: VICTIM, appName: "x", runId: "r", name: "X" });
              if (method.methodKind === "server_streaming") {
                for await (const m of res as AsyncIterable<unknown>) void m;
              } else await res;
            };
            const err = await call().then(
              () => "resolved",
              (e: unknown) => e,
            );
            expect(err, `${kind} ${method.name}`).toMatchObject({
              code: Code.PermissionDenied,
              rawMessage: "this token does not grant access to that project",
            });
          }
          checked.push(method.name);
        }
      }
      expect(checked).toContain("DeleteProject");
      expect(checked).toContain("Run");
      expect(checked).toContain("RunStream");
      expect(checked).toContain("WatchRuns");
      expect(checked.length).toBeGreaterThanOrEqual(20);
    });
  });

  describe("tokens: one spelling, the cache, and what the server issues", () => {
    const identity = (token: string) => rest("GET", "/v2/identity", token);

    /** base64url digit i of the alphabet. */
    const B64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

    it("other spellings of a valid token are refused, even once the token itself is in the cache", async () => {
      const token = t.devToken;
      expect((await identity(token)).status).toBe(200); // cached now
      const [h, p, s] = token.split(".");
      const variants = new Set<string>();
      // The signature's last character: its 4 unused low bits.
      const last = B64.indexOf(s[s.length - 1]);
      for (let k = 1; k < 16; k++) variants.add(`${h}.${p}.${s.slice(0, -1)}${B64[last ^ k]}`);
      // Standard base64's alphabet, padding, and the header's and payload's last characters.
      variants.add(`${h}.${p}.${s.replace(/-/g, "+").replace(/_/g, "/")}`);
      variants.add(`${h}.${p}.${s}=`);
      variants.add(`${h}.${p}.${s}==`);
      variants.add(`${h}.${p}.${s}%20`);
      variants.add(`${h}.${p.slice(0, -1)}${B64[B64.indexOf(p[p.length - 1]) ^ 1]}.${s}`);
      variants.add(`${h.slice(0, -1)}${B64[B64.indexOf(h[h.length - 1]) ^ 1]}.${p}.${s}`);
      variants.add(`${token}.`);
      variants.add(`${token}.${s}`);
      variants.add(`${h}.${p}.${s}.`);
      variants.add(`${h}..${p}.${s}`);
      variants.add(`${h}.${p}`);
      variants.add(`${h}.${p}.`);
      variants.add(token.toUpperCase());
      variants.delete(token);
      for (const v of variants) {
        const res = await identity(v);
        expect(res.status, `${v}: ${res.text}`).toBe(401);
      }
      // The token itself still works.
      expect((await identity(token)).status).toBe(200);
    });

    it("admin token spellings: only the exact token is admin", async () => {
      const admin = t.adminToken;
      for (const v of [`${admin}=`, `${admin} x`, admin.toUpperCase(), admin.slice(0, -1), `${admin}\u0000`]) {
        const res = await fetch(t.url + "/v2/projects", { headers: { authorization: `Bearer ${v}` } }).catch(
          (e: unknown) => e,
        );
        if (res instanceof Response) expect(res.status, JSON.stringify(v)).toBe(401);
      }
    });

    it("a cached token stops working once its service account is deleted", async () => {
      const admin = t.management();
      const sa = await admin.createServiceAccount({
        projectId: "p-dev",
        name: "short",
        expiresAt: timestampFromDate(new Date(Date.now() + DAY_MS)),
      });
      expect((await identity(sa.token)).status).toBe(200);
      expect((await identity(sa.token)).status).toBe(200);
      await admin.deleteServiceAccount({ projectId: "p-dev", serviceAccountId: sa.serviceAccount!.serviceAccountId });
      await expect.poll(async () => (await identity(sa.token)).status, { timeout: 5000 }).toBe(401);
    });

    it("tokens the server issues are written canonically and accepted (many keys, many tokens)", async () => {
      for (let i = 0; i < 20; i++) {
        const key = await signingKeyFrom(newEd25519Key());
        for (let j = 0; j < 20; j++) {
          const token = await issueToken(key, {
            projectId: "p-dev",
            serviceAccountId: "sa-dev",
            expiresAt: new Date(Date.now() + DAY_MS),
          });
          const s = token.slice(token.lastIndexOf(".") + 1);
          expect(Buffer.from(s, "base64url").toString("base64url")).toBe(s);
          await expect(verifyToken(token, () => key.publicKey)).resolves.toMatchObject({ projectId: "p-dev" });
        }
      }
      // And the real server's: new service accounts' tokens all work.
      const admin = t.management();
      for (let i = 0; i < 10; i++) {
        const sa = await admin.createServiceAccount({
          projectId: VICTIM,
          name: `n${i}`,
          expiresAt: timestampFromDate(new Date(Date.now() + DAY_MS)),
        });
        expect((await identity(sa.token)).status).toBe(200);
      }
    });
  });
});

// ---------------------------------------------------------------------------
// 3: the CLI's target.

describe("the CLI's admin token and SKIFF_HOST / SKIFF_PORT", () => {
  let tmp: string;
  let a: string;
  let cwd: string;
  const A_URL = "http://127.0.0.1:45678";

  beforeAll(async () => {
    tmp = await mkdtemp(path.join(tmpdir(), "skiff-edges-cli-"));
    a = path.join(tmp, "a");
    cwd = path.join(tmp, "work");
    await mkdir(a);
    await mkdir(cwd);
    await writeFile(path.join(a, "admin-token"), "token-of-a\n");
    await writeFile(path.join(a, "address"), `${A_URL}\n`);
  });

  afterAll(async () => {
    await rm(tmp, { recursive: true, force: true });
  });

  const resolve = (env: NodeJS.ProcessEnv, flags: { url?: string; token?: string } = {}): Target | Error => {
    try {
      return resolveTarget(flags, env, cwd);
    } catch (err) {
      return err as Error;
    }
  };

  it("no SKIFF_HOST or SKIFF_PORT spelling sends the folder's token anywhere but the folder's address", () => {
    const hosts = [
      "evil.example",
      "127.0.0.1.",
      "0.0.0.0",
      "::",
      "::1",
      "[::1]",
      "localhost",
      "127.1",
      "2130706433",
      "0x7f.0.0.1",
      "127.0.0.1:45678@evil.example",
      "evil.example@127.0.0.1",
      "evil.example/",
      "evil.example#",
      "evil.example?127.0.0.1",
      " 127.0.0.1 ",
      "127.0.0.1\t",
      "user:pw@127.0.0.1",
    ];
    const ports = ["45678", " 45678 ", "045678", "45678@evil.example", "45678/x", "45678#", "1", "0", "00"];
    let accepted = 0;
    for (const SKIFF_HOST of [undefined, ...hosts])
      for (const SKIFF_PORT of ports) {
        const target = resolve({ SKIFF_DATA_DIR: a, SKIFF_HOST, SKIFF_PORT });
        if (target instanceof Error) continue;
        accepted++;
        expect(target.url, `${SKIFF_HOST} ${SKIFF_PORT}`).toBe(A_URL);
        expect(target.token).toBe("token-of-a");
      }
    // Its own address named through SKIFF_PORT is still taken (the loop above was not all refusals).
    expect(accepted).toBeGreaterThan(0);
  });

  it("several data folders: a folder's token never goes to another folder's address", async () => {
    // SKIFF_DATA_DIR names a folder with an address but no token; ./.data has a token and no address.
    const b = path.join(tmp, "b");
    await mkdir(b, { recursive: true });
    await writeFile(path.join(b, "address"), "http://127.0.0.1:41111\n");
    await mkdir(path.join(cwd, ".data"), { recursive: true });
    await writeFile(path.join(cwd, ".data", "admin-token"), "token-of-cwd\n");
    try {
      for (const env of [{ SKIFF_DATA_DIR: b }, { SKIFF_DATA_DIR: b, SKIFF_PORT: "41111" }]) {
        const target = resolve(env);
        if (target instanceof Error) continue;
        expect(target.token === "token-of-cwd" && target.url.includes("41111"), JSON.stringify(target)).toBe(false);
      }
    } finally {
      await rm(path.join(cwd, ".data"), { recursive: true, force: true });
    }
  });

  it("an address file with a second line does not send the token to a host the first line does not name (hardening: needs write access to the data folder)", async () => {
    const c = path.join(tmp, "c");
    await mkdir(c, { recursive: true });
    await writeFile(path.join(c, "admin-token"), "token-of-c\n");
    await writeFile(path.join(c, "address"), `${A_URL}\n@evil.example\n`);
    const target = resolve({ SKIFF_DATA_DIR: c });
    if (target instanceof Error) return;
    let host: string | undefined;
    try {
      host = new URL(target.url).hostname;
    } catch {
      return; // an unusable URL: nothing is sent
    }
    expect(host, JSON.stringify(target.url)).toBe("127.0.0.1");
  });
});

// ---------------------------------------------------------------------------
// 4: the sandbox gate.

describe("the sandbox gate after `unset PWD`", () => {
  let tmp: string;
  let script: string;

  beforeAll(async () => {
    tmp = await mkdtemp(path.join(tmpdir(), "skiff-edges-gate-"));
    const { command } = sandboxArgv(
      { appDir: tmp, uid: 1_234_567, limits: DEFAULT_SANDBOX_LIMITS, command: "/usr/bin/env", args: [], env: {} },
      { info: 3, seccomp: 4, gate: 5 },
      [],
    );
    script = command[command.indexOf("-c") + 1];
    expect(script).toMatch(/^unset PWD; /);
  });

  afterAll(async () => {
    await rm(tmp, { recursive: true, force: true });
  });

  /** The gate as the sandbox runs it (dash, empty environment), the text on fd 5; the command prints its env. */
  const gate = async (text: string) => {
    const file = path.join(tmp, `gate-${Math.random().toString(36).slice(2)}`);
    await writeFile(file, text);
    const fh = await open(file, "r");
    try {
      return await new Promise<{ code: number | null; out: string; err: string }>((resolve) => {
        const child = spawn("/usr/bin/env", ["-i", "/bin/sh", "-c", script, "skiff-gate", "/usr/bin/env", "-0"], {
          stdio: ["ignore", "pipe", "pipe", "ignore", "ignore", fh.fd],
        });
        let out = "";
        let err = "";
        child.stdout!.on("data", (c: Buffer) => (out += c.toString()));
        child.stderr!.on("data", (c: Buffer) => (err += c.toString()));
        child.on("close", (code) => resolve({ code, out, err }));
      });
    } finally {
      await fh.close();
    }
  };

  it("a text without the release line still ends the sandbox with 125 and runs nothing", async () => {
    for (const text of ["", "export A='1'\n", "export A='x\nskiff_gate=go\n", "skiff_gate=no\n", "skiff_gate=go"]) {
      const r = await gate(text === "skiff_gate=go" ? "export A='\n" + text : text);
      expect(r.out, JSON.stringify(text)).toBe("");
      expect(r.code, JSON.stringify(text)).not.toBe(0);
    }
  });

  it("values are data: quotes, $(), backticks, newlines and a forged release line reach the app as they are", async () => {
    const env = {
      A: "'; echo INJECTED; '",
      B: "$(echo INJECTED)",
      C: "`echo INJECTED`",
      D: "x'\nskiff_gate=go\necho INJECTED\n'",
      E: "\\",
      F: "'",
      G: "\u2028\r\n\t",
      PWD: "/tenant-pwd",
      IFS: "x",
      PS4: "+$(echo INJECTED)",
      ENV: "/tmp/x",
    };
    const r = await gate(gateText(env));
    expect(r.code, r.err).toBe(0);
    const got = Object.fromEntries(
      r.out
        .split("\0")
        .filter(Boolean)
        .map((l) => [l.slice(0, l.indexOf("=")), l.slice(l.indexOf("=") + 1)]),
    );
    expect(got).toEqual(env);
  });

  it("the gate without an app PWD gives the app no PWD of the shell's", async () => {
    const r = await gate(gateText({ A: "1" }));
    expect(r.out.split("\0").filter(Boolean)).toEqual(["A=1"]);
  });

  it("a name the gate's shell takes for a number (OPTIND: dash's 'Illegal number' stopped the app) is refused at deploy and as a secret", async () => {
    // Found by this attack: services/apps/app-config.ts and services/secrets/names.ts accepted OPTIND, and
    // dash's export refuses a non-numeric one: the gate exited 2 before the app ran. The shell's, as PORT is skiff's.
    expect(() =>
      parseAppConfig(
        skiffToml({
          name: "optind",
          runtime: { kind: "cortex", language: "node", entry: "index.mjs" },
          env: { OPTIND: "x" },
        }),
      ),
    ).toThrow(/env\.OPTIND.*is the shell's/);
    expect(secretNameProblem("OPTIND")).toMatch(/is the shell's/);
    // What the gate does with it, were it given one: the reason for the refusal.
    const r = await gate(gateText({ OPTIND: "x" }));
    expect(r.code).not.toBe(0);
  });

  it("names starting with skiff_ are refused before any sandbox starts", () => {
    for (const name of ["skiff_gate", "skiff_text"])
      expect(() =>
        sandboxArgv(
          {
            appDir: tmp,
            uid: 1_234_567,
            limits: DEFAULT_SANDBOX_LIMITS,
            command: "/bin/true",
            args: [],
            env: { [name]: "go" },
          },
          { info: 3, seccomp: 4, gate: 5 },
          [],
        ),
      ).toThrow(/is not a variable name/);
  });

  /** The app (node) in a real sandbox, as root: what it printed of its environment, and stderr. */
  const sandboxEnv = async (env: Record<string, string>) => {
    const appDir = await mkdtemp(path.join(tmpdir(), "skiff-edges-app-"));
    await chmod(appDir, 0o755);
    try {
      const SANDBOX = defaultSandbox({ limits: { ...DEFAULT_SANDBOX_LIMITS, memoryMb: 1024 } });
      const sandboxed = spawnSandboxed(SANDBOX.host, {
        appDir,
        uid: 1_234_568,
        limits: SANDBOX.limits,
        command: process.execPath,
        args: ["-e", "process.stdout.write(JSON.stringify(process.env))"],
        env,
      });
      let out = "";
      let err = "";
      sandboxed.child.stdout!.on("data", (c: Buffer) => (out += c.toString()));
      sandboxed.child.stderr!.on("data", (c: Buffer) => (err += c.toString()));
      await new Promise((resolve) => sandboxed.child.on("close", resolve));
      return { out, err };
    } finally {
      await rm(appDir, { recursive: true, force: true });
    }
  };

  it("a real sandbox: the app's environment is exactly its own, with shell text in names' values", async () => {
    const env = {
      A: "'; echo INJECTED >&2; '",
      B: "$(id)",
      PWD: "/p",
      OLDPWD: "/o",
      IFS: "x",
      C: "x'\nskiff_gate=go\n'",
    };
    const { out, err } = await sandboxEnv(env);
    expect(err).not.toContain("INJECTED");
    expect(out, err).not.toBe("");
    expect(JSON.parse(out)).toEqual(env);
  }, 30_000);
});

// ---------------------------------------------------------------------------
// 5: the example event consumer.

describe("the example event consumer and a ports file left by a dead nats-server", () => {
  /**
   * A listener that plays NATS: for each client, it takes a nonce from `relayTo` (the real server) when given,
   * hands the client that INFO, and replays the client's CONNECT (nkey and signature) on its own connection.
   */
  function attacker(relayTo: string | undefined) {
    const seen: string[] = [];
    let relayed = "";
    let onConnect: () => void = () => undefined;
    const connected = new Promise<void>((r) => (onConnect = r));
    const sockets: net.Socket[] = [];
    const server = net.createServer((victim) => {
      sockets.push(victim);
      victim.on("error", () => undefined);
      const line = (s: net.Socket) =>
        new Promise<string>((resolve) => {
          let buf = "";
          const on = (c: Buffer) => {
            buf += c.toString();
            const i = buf.indexOf("\r\n");
            if (i >= 0) {
              s.off("data", on);
              resolve(buf.slice(0, i));
            }
          };
          s.on("data", on);
        });
      void (async () => {
        let real: net.Socket | undefined;
        let info = `INFO {"server_id":"x","version":"2.10.0","proto":1,"host":"127.0.0.1","port":4222,"max_payload":1048576,"auth_required":true,"nonce":"bm9uY2Vub25jZW5vbmNl"}`;
        if (relayTo) {
          const u = new URL(relayTo);
          real = net.connect(Number(u.port), u.hostname);
          sockets.push(real);
          real.on("error", () => undefined);
          info = await line(real);
        }
        victim.write(`${info}\r\n`);
        const connect = await line(victim);
        seen.push(connect);
        if (real) {
          real.on("data", (c: Buffer) => (relayed += c.toString()));
          real.write(
            `${connect}\r\nPING\r\nSUB _INBOX.attacker 1\r\nPUB $JS.API.STREAM.NAMES _INBOX.attacker 0\r\n\r\n`,
          );
          await new Promise((r) => setTimeout(r, 1000));
        }
        onConnect();
      })();
    });
    return {
      seen,
      relayed: () => relayed,
      connected,
      listen: () =>
        new Promise<number>((resolve) =>
          server.listen(0, "127.0.0.1", () => resolve((server.address() as net.AddressInfo).port)),
        ),
      close: () => {
        for (const s of sockets) s.destroy();
        server.close();
      },
    };
  }

  /** Runs consume.ts on `dataDir` until the attacker saw its CONNECT, it exits, or 15 s pass. */
  async function consume(dataDir: string, until: Promise<void>): Promise<void> {
    const child: ChildProcess = spawn(
      process.execPath,
      ["--import", "tsx", "examples/event-consumer/consume.ts", "--max", "1"],
      { cwd: ROOT, env: { ...process.env, SKIFF_NATS_URL: "", SKIFF_DATA_DIR: dataDir }, stdio: "ignore" },
    );
    const exited = new Promise<void>((r) => child.on("close", () => r()));
    await Promise.race([until, exited, new Promise((r) => setTimeout(r, 15_000))]);
    child.kill("SIGKILL");
    await exited;
  }

  it("skiff stopped, its server's ports file left behind, its pid now another process's: the consumer does not connect to whoever listens on that port", async () => {
    const dataDir = await mkdtemp(path.join(tmpdir(), "skiff-edges-consumer-"));
    const other = spawn("/usr/bin/sleep", ["60"], { stdio: "ignore" }); // the pid, reused by an unrelated program
    const evil = attacker(undefined);
    try {
      // What a nats-server killed with SIGKILL leaves (skiff made the folder and the nkey).
      const handle = await connectNats({ dataDir, logger: silentLogger });
      await handle.close();
      const port = await evil.listen();
      await writeFile(
        path.join(dataDir, "nats", `nats-server_${other.pid}.ports`),
        JSON.stringify({ nats: [`nats://127.0.0.1:${port}`] }),
      );
      await consume(dataDir, evil.connected);
      expect(evil.seen, "the consumer sent its CONNECT (skiff's nkey and a signature) to another process").toEqual([]);
    } finally {
      other.kill("SIGKILL");
      evil.close();
      await rm(dataDir, { recursive: true, force: true });
    }
  }, 60_000);

  it("skiff running, a stale ports file that sorts first: no one can relay the consumer's nkey signature into skiff's NATS", async () => {
    const dataDir = await mkdtemp(path.join(tmpdir(), "skiff-edges-relay-"));
    const handle = await connectNats({ dataDir, logger: silentLogger });
    const evil = attacker(handle.url);
    try {
      await provision(handle.nc, silentLogger);
      const port = await evil.listen();
      // pid 1 (always alive) stands for a reused pid: after a SIGKILL and a restart the dead server's file has the
      // smaller pid and sorts first (readdir is sorted), e.g. nats-server_15604.ports before nats-server_15612.ports.
      await writeFile(
        path.join(dataDir, "nats", "nats-server_1.ports"),
        JSON.stringify({ nats: [`nats://127.0.0.1:${port}`] }),
      );
      await consume(dataDir, evil.connected);
      expect(evil.relayed(), "the attacker's own connection was admitted to skiff's NATS").not.toContain("PONG");
      expect(evil.relayed()).not.toContain("KV_skiff");
    } finally {
      evil.close();
      await handle.close();
      await rm(dataDir, { recursive: true, force: true });
    }
  }, 60_000);

  it("the nkey seed file and the nats folder are the owner's only", async () => {
    const dataDir = await mkdtemp(path.join(tmpdir(), "skiff-edges-nk-"));
    const handle = await connectNats({ dataDir, logger: silentLogger });
    try {
      expect((await stat(path.join(dataDir, "nats"))).mode & 0o077).toBe(0);
      expect((await stat(path.join(dataDir, "nats", "skiff.nk"))).mode & 0o077).toBe(0);
      expect((await readFile(path.join(dataDir, "nats", "skiff.nk"), "utf8")).trim()).toMatch(/^SU/);
    } finally {
      await handle.close();
      await rm(dataDir, { recursive: true, force: true });
    }
  }, 60_000);
});
