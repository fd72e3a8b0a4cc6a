// Attacks through what a build leaves behind: a tenant's install script
// (here npm's postinstall, run in the build sandbox as the build's uid) turns
// files into links, FIFOs or sockets, leaves a daemon, fills the disk, or
// reads the operator's environment, hoping that skiff, as root, reads,
// follows or removes what it left. Every deploy goes the way a real one does:
// a bundle packed from a folder, unpacked and prepared by the deployment
// cache. Real bwrap sandboxes, as root.
import { existsSync } from "node:fs";
import { chmod, lstat, mkdir, mkdtemp, readdir, readFile, readlink, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { packApp, sha256 } from "../../services/apps/bundle.js";
import { silentLogger } from "../../services/config/logger.js";
import { PrepareFailed } from "../../services/runs/errors.js";
import { DeploymentCache } from "../../services/runner/deployment-cache.js";
import { DEFAULT_SANDBOX_LIMITS } from "../../services/runner/sandbox.js";
import { configureSandbox } from "../../services/runner/sandbox-setup.js";
import { skiffToml, writeApp } from "../helpers/apps.js";

const MAX_BUILD_BYTES = 64 * 1024 * 1024;
const MAX_BUILD_FILES = 200;

let tmp: string;
let cache: DeploymentCache;

/** A Custom Node app whose package.json has a local dependency (so npm installs) and `script` as its postinstall. */
async function appWith(script: string): Promise<string> {
  const dir = await writeApp(tmp, {
    "skiff.toml": skiffToml({ name: "builder", runtime: { kind: "custom", command: ["node", "server.js"] } }),
    "server.js": "require('node:http').createServer((q, s) => s.end('ok')).listen(process.env.PORT);\n",
    "package.json": JSON.stringify({
      name: "builder",
      private: true,
      dependencies: { dep: "file:./dep" },
      scripts: { postinstall: "sh attack.sh" },
    }),
    "dep/package.json": JSON.stringify({ name: "dep", version: "1.0.0" }),
    "attack.sh": script,
  });
  await chmod(dir, 0o755);
  return dir;
}

/** Deploys the folder as a real deploy does; the error, if it is refused. */
async function deploy(dir: string): Promise<{ dir?: string; error?: Error }> {
  const { bytes } = await packApp(dir);
  try {
    const ready = await cache.get(sha256(bytes), async () => bytes);
    return { dir: ready.dir };
  } catch (err) {
    return { error: err as Error };
  }
}

/** Nothing of a build is left: no staging or build folder, no tmpfs still mounted. */
async function nothingLeft(): Promise<void> {
  const names = await readdir(cache.root).catch(() => [] as string[]);
  expect(names.filter((n) => n.startsWith(".staging-"))).toEqual([]);
  expect(await readFile("/proc/self/mounts", "utf8")).not.toContain(cache.root);
}

async function refused(script: string): Promise<string> {
  const { dir, error } = await deploy(await appWith(script));
  expect(dir).toBeUndefined();
  expect(error).toBeInstanceOf(PrepareFailed);
  await nothingLeft();
  return error!.message;
}

beforeAll(async () => {
  tmp = await mkdtemp(path.join(tmpdir(), "skiff-security-build-"));
  await chmod(tmp, 0o755);
  const sandbox = configureSandbox(
    {
      sandbox: "on",
      replicaMemoryMb: DEFAULT_SANDBOX_LIMITS.memoryMb,
      replicaPids: DEFAULT_SANDBOX_LIMITS.pids,
      replicaFileMb: DEFAULT_SANDBOX_LIMITS.fileMb,
      replicaTmpMb: DEFAULT_SANDBOX_LIMITS.tmpMb,
      replicaCpuSeconds: 0,
      replicaOpenFiles: DEFAULT_SANDBOX_LIMITS.openFiles,
      replicaNetwork: "none",
      maxBuildBytes: MAX_BUILD_BYTES,
      maxBuildFiles: MAX_BUILD_FILES,
      maxConcurrentBuilds: 1,
    },
    { warn: () => undefined, info: () => undefined },
  );
  cache = new DeploymentCache(path.join(tmp, "deployments"), {
    maxBytes: 10 * 1024 * 1024,
    logger: silentLogger,
    sandbox,
  });
}, 60_000);

afterAll(async () => {
  await rm(tmp, { recursive: true, force: true });
});

describe("security - what a build leaves is data, never followed, read or removed through a link", () => {
  it("a build that works: its output is skiff's, read-only to others, with the links a venv needs", async () => {
    const { dir, error } = await deploy(
      await appWith(
        "ln -s /usr/bin/node node-link && ln -s server.js main.js && ln -s main.js chain.js && echo built > built.txt\n",
      ),
    );
    expect(error).toBeUndefined();
    expect(await readFile(path.join(dir!, "built.txt"), "utf8")).toBe("built\n");
    expect(await readlink(path.join(dir!, "node-link"))).toBe("/usr/bin/node");
    expect(await readlink(path.join(dir!, "main.js"))).toBe("server.js");
    // A link to a link, as a venv's bin/python -> python3 -> /usr/bin/python3.
    expect(await readlink(path.join(dir!, "chain.js"))).toBe("main.js");
    for (const name of ["built.txt", "node_modules", "server.js", "."]) {
      const st = await lstat(path.join(dir!, name));
      expect(st.uid).toBe(0);
      expect(st.mode & 0o022).toBe(0);
    }
    await nothingLeft();
  });

  it("skiff.toml turned into a link to a host file: refused, the file unread", async () => {
    const message = await refused("rm skiff.toml && ln -s /etc/passwd skiff.toml\n");
    expect(message).toMatch(/^the build left "skiff.toml", a link with a target outside the app folder/);
    expect(message).not.toContain("root:");
  });

  it("skiff.toml turned into a FIFO, or a FIFO or socket anywhere: refused at once, nothing waits on it", async () => {
    expect(await refused("rm skiff.toml && mkfifo skiff.toml\n")).toMatch(
      /^the build left "skiff.toml", which is not a file, folder or link/,
    );
    expect(await refused("mkdir -p node_modules/x && mkfifo node_modules/x/p\n")).toMatch(/"node_modules\/x\/p"/);
    expect(await refused(`python3 -c "import socket; socket.socket(socket.AF_UNIX).bind('sock')"\n`)).toMatch(
      /"sock", which is not a file, folder or link/,
    );
  });

  it("a link that stays in the folder by its text but leaves it through another link: refused", async () => {
    expect(await refused("mkdir -p a/b && ln -s /usr a/b/sys && ln -s sys/../etc a/b/x\n")).toMatch(
      /"a\/b\/x", a link with a target through another link/,
    );
    expect(await refused("ln -s ../../../../etc/shadow up\n")).toMatch(/"up", a link with a target outside/);
    expect(await refused("ln -s /app/../etc/shadow abs\n")).toMatch(/"abs", a link with a target that climbs/);
    // The kernel applies ".." after the links before it: /usr/lib/ssl/private leads to /etc/ssl/private on Debian.
    expect(await refused("ln -s /usr/lib/ssl/private/../../.. l\n")).toMatch(/"l", a link with a target that climbs/);
  });

  it("skiff's own marker planted by the build: refused", async () => {
    expect(await refused("mkdir -p .skiff && echo '{}' > .skiff/prepared.json\n")).toMatch(/skiff's own marker/);
  });

  it(".skiff swapped for a link to another folder before failing: that folder is untouched", async () => {
    const victim = path.join(tmp, "victim-venv");
    await mkdir(victim, { recursive: true });
    await writeFile(path.join(victim, "keep"), "another tenant's venv\n");
    const message = await refused(`rm -rf .skiff && ln -s ${victim} .skiff && exit 1\n`);
    expect(message).toMatch(/^npm install failed/);
    expect(await readFile(path.join(victim, "keep"), "utf8")).toBe("another tenant's venv\n");
  });

  it("a Python build that swaps .skiff for a link and fails: the link's target is untouched", async () => {
    const victim = path.join(tmp, "victim-py");
    await mkdir(path.join(victim, "venv"), { recursive: true });
    await writeFile(path.join(victim, "venv", "keep"), "another tenant's venv\n");
    // A local package whose build runs setup.py, offline: setuptools comes from the system's wheels.
    const setup = [
      "import os",
      "os.rename('/app/.skiff', '/app/.skiff-old')",
      `os.symlink(${JSON.stringify(victim)}, '/app/.skiff')`,
      "raise SystemExit(1)",
    ].join("\n");
    const dir = await writeApp(tmp, {
      "skiff.toml": skiffToml({ name: "py", runtime: { kind: "cortex", language: "python", entry: "main.py" } }),
      "main.py": "def f():\n    return 1\n",
      "requirements.txt": "--no-index\n--find-links /usr/share/python-wheels\n./pkg\n",
      "pkg/pyproject.toml": '[build-system]\nrequires = ["setuptools"]\nbuild-backend = "setuptools.build_meta"\n',
      "pkg/setup.py": setup + "\n",
    });
    await chmod(dir, 0o755);
    const { error } = await deploy(dir);
    expect(error).toBeInstanceOf(PrepareFailed);
    expect(error!.message).toMatch(/^could not install requirements\.txt/);
    await nothingLeft();
    expect(await readFile(path.join(victim, "venv", "keep"), "utf8")).toBe("another tenant's venv\n");
  });

  it("a build that writes more than SKIFF_MAX_BUILD_BYTES fails in its tmpfs; more files than allowed are refused", async () => {
    const message = await refused("for i in 1 2 3; do head -c 30000000 /dev/zero > big$i || exit 1; done\n");
    expect(message).toMatch(/^npm install failed/);
    expect(await refused(`mkdir many && cd many && for i in $(seq 1 ${MAX_BUILD_FILES + 1}); do : > f$i; done\n`)).toBe(
      `the build left more than ${MAX_BUILD_FILES} files (SKIFF_MAX_BUILD_FILES): nothing was deployed`,
    );
  });

  it("what a build leaves is what the deployment counts against the project's bytes", async () => {
    const { bytes } = await packApp(await appWith("head -c 5000000 /dev/zero > deps.bin\n"));
    const ready = await cache.get(sha256(bytes), async () => bytes);
    expect(bytes.length).toBeLessThan(10_000);
    expect(ready.unpackedBytes).toBeGreaterThan(5_000_000);
  });

  it("deploys started together build one after another (SKIFF_MAX_CONCURRENT_BUILDS = 1 here)", async () => {
    // Each build writes when it started and ended (nanoseconds) into what it leaves.
    const script = (n: number) => `date +%s%N > started; sleep 0.5; echo ${n} > n; date +%s%N > ended\n`;
    const deployed = await Promise.all([1, 2, 3].map(async (n) => deploy(await appWith(script(n)))));
    const spans = await Promise.all(
      deployed.map(async ({ dir, error }) => {
        expect(error).toBeUndefined();
        const read = async (name: string) => BigInt((await readFile(path.join(dir!, name), "utf8")).trim());
        return [await read("started"), await read("ended")] as const;
      }),
    );
    spans.sort((a, b) => (a[0] < b[0] ? -1 : 1));
    for (let i = 1; i < spans.length; i++) expect(spans[i][0] >= spans[i - 1][1]).toBe(true);
  });

  it("one project's builds take turns with another's: a queue of slow builds holds up only its own", async () => {
    // The first build lasts long enough for the others (and p-other's, started after it) to be waiting.
    const script = (n: string) => `date +%s%N > started; sleep ${n === "a1" ? 3 : 0.3}; echo ${n} > n\n`;
    const bundles = await Promise.all(
      ["a1", "a2", "a3", "b1"].map(async (n) => (await packApp(await appWith(script(n)))).bytes),
    );
    const start = (i: number, project: string) => cache.get(sha256(bundles[i]), async () => bundles[i], project);
    const a = [start(0, "p-slow")];
    // Once the first is building (its area exists), the other two of its project come, then p-other's.
    while (!(await readdir(cache.root).catch(() => [] as string[])).some((n) => n.endsWith(".build")))
      await new Promise((resolve) => setTimeout(resolve, 20));
    a.push(start(1, "p-slow"), start(2, "p-slow"));
    await new Promise((resolve) => setTimeout(resolve, 500));
    const done = await Promise.all([...a, start(3, "p-other")]);
    const started = await Promise.all(
      done.map(async (r) => BigInt((await readFile(path.join(r.dir, "started"), "utf8")).trim())),
    );
    // b1 went before the second and third builds of p-slow, which were waiting before it came.
    expect(started[3] < started[1] && started[3] < started[2]).toBe(true);
  });

  it("the operator's npm and pip settings never reach the build", async () => {
    const saved = { ...process.env };
    Object.assign(process.env, {
      npm_config__authToken: "operator-registry-token",
      npm_config_userconfig: "/root/.npmrc",
      PIP_INDEX_URL: "https://operator:secret@index.example/simple",
      https_proxy: "http://operator:secret@proxy.example:3128",
    });
    try {
      const { dir, error } = await deploy(await appWith("env > env.txt\n"));
      expect(error).toBeUndefined();
      const env = await readFile(path.join(dir!, "env.txt"), "utf8");
      for (const leak of ["operator", "PIP_INDEX_URL", "_authToken", "/root/.npmrc", "proxy.example"])
        expect(env).not.toContain(leak);
    } finally {
      for (const k of Object.keys(process.env)) if (!(k in saved)) delete process.env[k];
      Object.assign(process.env, saved);
    }
  });

  it("a daemon the build leaves behind ends with it and changes nothing afterwards", async () => {
    const { dir, error } = await deploy(
      await appWith("(setsid sh -c 'sleep 2; ln -s / late; touch late2' > /dev/null 2>&1 &)\nexit 0\n"),
    );
    expect(error).toBeUndefined();
    await new Promise((resolve) => setTimeout(resolve, 3000));
    expect(existsSync(path.join(dir!, "late"))).toBe(false);
    expect(existsSync(path.join(dir!, "late2"))).toBe(false);
    await nothingLeft();
  });
});
