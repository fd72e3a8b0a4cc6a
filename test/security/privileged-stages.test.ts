// Attacks on what runs with host privileges around a sandbox: the tenant's
// [env] (loader variables naming a shared object the attacker placed),
// capabilities left in the stages before the drop to the app's uid, system
// calls that reach the kernel's shared state, /proc/sys, host paths in
// /proc/1/cmdline, and a command that probes the host's files. Each attack
// must fail while the app itself still runs. Real bwrap sandboxes, as root.
import { execFileSync } from "node:child_process";
import { existsSync } from "node:fs";
import { chmod, mkdir, mkdtemp, readFile, readdir, rm, symlink, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { afterAll, beforeAll, describe, expect, it, onTestFinished } from "vitest";
import { parseAppConfig } from "../../services/apps/app-config.js";
import { silentLogger } from "../../services/config/logger.js";
import type { InvokeRequest } from "../../services/runs/invoke.js";
import { prepareDeployment } from "../../services/runner/prepare.js";
import { commandExists } from "../../services/runner/replica.js";
import { Runner } from "../../services/runner/runner.js";
import { DEFAULT_SANDBOX_LIMITS, defaultSandbox, spawnSandboxed } from "../../services/runner/sandbox.js";
import { hashedUids } from "../../services/runner/uids.js";
import { skiffToml, writeApp } from "../helpers/apps.js";

/** A link of the system folders that leads out of them on the host, as Debian's /usr/lib/ssl/private does. */
const link0 = () => "/usr/share/skiff-security-test-link0";
const SANDBOX_MODULE = path.resolve(import.meta.dirname, "../../services/runner/sandbox.ts");
const SETUP_MODULE = path.resolve(import.meta.dirname, "../../services/runner/sandbox-setup.ts");
const SANDBOX = defaultSandbox({ limits: { ...DEFAULT_SANDBOX_LIMITS, memoryMb: 1024 } });

let tmp: string;
let hostMarks: string;
let hostObject: string;
let runner: Runner;
let seq = 0;

/** A shared object whose constructor writes who loaded it (uid, effective capabilities, program) to two files. */
const EVIL_C = (hostMarks: string) => `
#include <stdio.h>
#include <string.h>
#include <unistd.h>
__attribute__((constructor)) static void mark(void) {
  char cap[64] = "?", line[256], exe[256] = "";
  FILE *s = fopen("/proc/self/status", "r");
  if (s) { while (fgets(line, sizeof line, s)) if (!strncmp(line, "CapEff:", 7)) sscanf(line + 7, "%63s", cap); fclose(s); }
  ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (n > 0) exe[n] = 0;
  const char *dests[] = { "/tmp/evil-marks", "${hostMarks}" };
  for (int i = 0; i < 2; i++) {
    FILE *f = fopen(dests[i], "a");
    if (f) { fprintf(f, "uid=%d capeff=%s exe=%s\\n", (int)getuid(), cap, exe); fclose(f); }
  }
}
`;

/** The intruder: each function reports what one attack got. */
const MAIN_PY = `
import ctypes, errno, os

libc = ctypes.CDLL(None, use_errno=True)

def marks():
    try:
        with open("/tmp/evil-marks") as f:
            return f.read().splitlines()
    except FileNotFoundError:
        return []

def status():
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key.startswith("Cap") or key in ("NoNewPrivs", "Seccomp", "Uid"):
                out[key] = value.strip()
    return out

def _call(nr, *args):
    r = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) for a in args])
    return "ok" if r >= 0 else errno.errorcode.get(ctypes.get_errno(), str(ctypes.get_errno()))

def syscalls():
    params = ctypes.create_string_buffer(120)
    return {
        "unshare_user": _call(272, 0x10000000),
        "unshare_net": _call(272, 0x40000000),
        "clone_newuser": _call(56, 0x10000000 | 17, 0, 0, 0, 0),
        "clone3": _call(435, 0, 0),
        "setns": _call(308, 0, 0),
        "keyctl_join": _call(250, 1, 0),
        "userfaultfd": _call(323, 1),
        "io_uring_setup": _call(425, 1, ctypes.addressof(params)),
        "ptrace_traceme": _call(101, 0, 0, 0, 0),
        "mount": _call(165, 0, 0, 0, 0, 0),
        "kexec_load": _call(246, 0, 0, 0, 0),
        "bpf": _call(321, 0, 0, 0),
        "modify_ldt": _call(154, 0, 0, 0),
        "personality_exec": _call(135, 0x0400000),
        "personality_query": _call(135, 0xFFFFFFFF),
    }

def proc_sys():
    try:
        with open("/proc/sys/kernel/ns_last_pid", "w") as f:
            f.write("1")
        return "written"
    except OSError as err:
        return errno.errorcode.get(err.errno, str(err.errno))

def pid1():
    with open("/proc/1/cmdline", "rb") as f:
        return f.read().decode("latin-1")

def mountinfo():
    with open("/proc/self/mountinfo") as f:
        return f.read()

def eventfds():
    fds = []
    try:
        while len(fds) < 100000:
            fds.append(os.eventfd(0))
        return {"opened": len(fds), "error": None}
    except OSError as err:
        return {"opened": len(fds), "error": errno.errorcode.get(err.errno, str(err.errno))}
    finally:
        for fd in fds:
            os.close(fd)

def channel_name():
    import socket
    return socket.socket(fileno=os.dup(3)).getsockname()

def environ():
    return dict(os.environ)
`;

const cortexToml = (name: string, env: Record<string, string>) =>
  skiffToml({ name, runtime: { kind: "cortex", language: "python", entry: "main.py" }, env });

function request(fn: string): InvokeRequest {
  return {
    runId: `run-${++seq}`,
    method: "POST",
    path: `/${fn}`,
    query: "",
    headers: {},
    body: new TextEncoder().encode("{}"),
  };
}

async function call(project: string, app: string, fn: string): Promise<any> {
  const res = await runner.invoke(project, app, request(fn));
  const body = JSON.parse(Buffer.from(res.body).toString()) as { result?: unknown; error?: unknown };
  expect(res.status, JSON.stringify(body)).toBe(200);
  return body.result;
}

/** Writes the intruder app with its [env], prepares it as a deploy does (the import check runs), and deploys it. */
async function deployIntruder(project: string, name: string, env: Record<string, string>): Promise<void> {
  const dir = await writeApp(tmp, { "main.py": MAIN_PY });
  await writeFile(path.join(dir, "evil.so"), await readFile(hostObject));
  await chmod(dir, 0o755);
  const config = parseAppConfig(cortexToml(name, env));
  const prepared = await prepareDeployment(dir, config, silentLogger, { sandbox: SANDBOX });
  await runner.deploy({ projectId: project, appName: name, version: 1, dir, config, prepared });
}

beforeAll(async () => {
  tmp = await mkdtemp(path.join(tmpdir(), "skiff-security-stages-"));
  await chmod(tmp, 0o755);
  hostMarks = path.join(tmp, "host-marks");
  hostObject = path.join(tmp, "evil.so");
  await writeFile(path.join(tmp, "evil.c"), EVIL_C(hostMarks));
  execFileSync("cc", ["-shared", "-fPIC", "-o", hostObject, path.join(tmp, "evil.c")]);
  runner = new Runner({
    workDir: path.join(tmp, "replicas"),
    logger: silentLogger,
    startTimeoutMs: 20_000,
    sandbox: SANDBOX,
  });
}, 60_000);

afterAll(async () => {
  await runner?.close();
  await rm(tmp, { recursive: true, force: true });
});

describe("security - nothing a tenant controls reaches a stage with host privileges", () => {
  it("[env] LD_PRELOAD and LD_AUDIT naming a host file load nowhere outside the sandbox, at deploy or at start", async () => {
    await deployIntruder("p-preload-host", "preload-host", { LD_PRELOAD: hostObject, LD_AUDIT: hostObject });
    expect(await call("p-preload-host", "preload-host", "marks")).toEqual([]);
    // The object exists on the host and loads there: had any stage outside the sandbox taken it, it would have written.
    expect(existsSync(hostMarks)).toBe(false);
  });

  it("[env] LD_PRELOAD of the app's own object loads only in processes of the app's uid without capabilities", async () => {
    await deployIntruder("p-preload-app", "preload-app", { LD_PRELOAD: "/app/evil.so" });
    const uid = await hashedUids.projectUid("p-preload-app");
    const marks = (await call("p-preload-app", "preload-app", "marks")) as string[];
    // The app's own interpreter loaded it (the attack's object works), and nothing before the drop did.
    expect(marks.some((m) => m.includes("python"))).toBe(true);
    for (const m of marks) expect(m).toMatch(new RegExp(`^uid=${uid} capeff=0000000000000000 `));
    expect(existsSync(hostMarks)).toBe(false);
  });

  it("bwrap and the stages before the drop get a fixed environment; the app gets exactly its own", async () => {
    const sandboxed = spawnSandboxed(SANDBOX.host, {
      appDir: tmp,
      uid: 1_234_567,
      limits: SANDBOX.limits,
      // The app's own process, not a shell of its own (which would set PWD itself).
      command: process.execPath,
      args: [
        "-e",
        "process.stdout.write(Object.entries(process.env).map(([k, v]) => k + '=' + v).join('\\0')); setTimeout(() => {}, 2000)",
      ],
      env: { LD_PRELOAD: "/nowhere.so", GCONV_PATH: "/app", A: 'it\'s $HOME `x` "y"\nz' },
    });
    await sandboxed.ready; // bwrap has said its init pid: the process spawned is bwrap by now
    const stages = await readFile(`/proc/${sandboxed.child.pid}/environ`, "utf8");
    expect(stages.split("\0").filter(Boolean)).toEqual(["PATH=/usr/bin:/bin"]);
    let out = "";
    sandboxed.child.stdout!.on("data", (c: Buffer) => (out += c.toString()));
    await new Promise((resolve) => sandboxed.child.on("close", resolve));
    expect(out.split("\0").filter(Boolean).sort()).toEqual(
      ['A=it\'s $HOME `x` "y"\nz', "GCONV_PATH=/app", "LD_PRELOAD=/nowhere.so"].sort(),
    );
  });

  it("a replica has no capability, not even in its bounding set, no_new_privs, and a seccomp filter", async () => {
    await deployIntruder("p-caps", "caps", {});
    const status = await call("p-caps", "caps", "status");
    for (const key of ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"]) expect(status[key]).toBe("0000000000000000");
    expect(status).toMatchObject({ NoNewPrivs: "1", Seccomp: "2" });
  });

  it("system calls that reach the kernel's shared state fail", async () => {
    await deployIntruder("p-syscalls", "syscalls", {});
    const got = await call("p-syscalls", "syscalls", "syscalls");
    expect(got).toEqual({
      unshare_user: "EPERM",
      unshare_net: "EPERM",
      clone_newuser: "EPERM",
      clone3: "ENOSYS",
      setns: "EPERM",
      keyctl_join: "EPERM",
      userfaultfd: "EPERM",
      io_uring_setup: "EPERM",
      ptrace_traceme: "EPERM",
      mount: "EPERM",
      kexec_load: "EPERM",
      bpf: "EPERM",
      modify_ldt: "EPERM",
      personality_exec: "EPERM",
      personality_query: "ok",
    });
  });

  it("the channel's socket names no host path (getsockname of fd 3)", async () => {
    await deployIntruder("p-channel", "channel", {});
    const name = (await call("p-channel", "channel", "channel_name")) as string;
    expect(name).toMatch(/^\/proc\/self\/fd\/\d+\/channel\.sock\.new$/);
  });

  it("open files are bounded per process (SKIFF_REPLICA_OPEN_FILES): eventfds stop at the limit", async () => {
    await deployIntruder("p-eventfds", "eventfds", {});
    const got = await call("p-eventfds", "eventfds", "eventfds");
    expect(got.error).toBe("EMFILE");
    expect(got.opened).toBeLessThan(SANDBOX.limits.openFiles);
    expect(got.opened).toBeGreaterThan(SANDBOX.limits.openFiles - 64);
  });

  it("/proc/sys is read-only and /proc/1/cmdline names no host path", async () => {
    await deployIntruder("p-proc", "proc", {});
    expect(await call("p-proc", "proc", "proc_sys")).toBe("EROFS");
    const cmdline = (await call("p-proc", "proc", "pid1")) as string;
    expect(cmdline).toContain("bwrap");
    expect(cmdline).not.toContain(tmp);
    expect(cmdline).not.toContain("/work");
    expect(cmdline).not.toContain("deployments");
  });

  it("/proc/self/mountinfo names no host path: the app's folder and the shims are mounted from neutral ones", async () => {
    await deployIntruder("p-mounts", "mounts", {});
    const mounts = (await call("p-mounts", "mounts", "mountinfo")) as string;
    expect(mounts).toMatch(/ \/app\/main\.py /);
    expect(mounts).toMatch(/ \/skiff /);
    for (const host of [tmp, path.resolve(import.meta.dirname, "../.."), "deployments", "replicas"])
      expect(mounts).not.toContain(host);
  });

  it("a Custom app's command tells nothing of the host's files", async () => {
    await rm(link0(), { force: true });
    await symlink("/etc/ssl", link0());
    onTestFinished(() => rm(link0(), { force: true }));
    const app = await writeApp(tmp, { "run.sh": "#!/bin/sh\n" });
    expect(commandExists("/bin/sh", app)).toBe(true);
    expect(commandExists("/app/run.sh", app)).toBe(true);
    expect(commandExists("run.sh", app)).toBe(false); // a bare name is looked for on PATH only
    expect(commandExists("./run.sh", app)).toBe(true);
    // The app's venv on the PATH (cerebrium.toml's pip dependencies): its programs are found, and a link of its
    // build's there that leads out of the app folder reads as missing, as any link of the app's does.
    const venvBin = path.join(app, ".venv", "bin");
    await mkdir(venvBin, { recursive: true });
    await writeFile(path.join(venvBin, "served"), "#!/bin/sh\n");
    await symlink(hostObject, path.join(venvBin, "probe"));
    await symlink(`${hostObject}-missing`, path.join(venvBin, "probe-missing"));
    const withVenv = [venvBin, "/usr/local/bin", "/usr/bin", "/bin"];
    expect(commandExists("served", app, withVenv)).toBe(true);
    expect(commandExists("served", app)).toBe(false);
    expect(commandExists("sh", app, withVenv)).toBe(true);
    expect(commandExists("probe", app, withVenv)).toBe(false);
    expect(commandExists("probe-missing", app, withVenv)).toBe(false);
    // Files that exist on the host but not in a sandbox read as missing, by any path.
    for (const probe of [hostObject, "/etc/passwd", "../../../../etc/passwd", `/app/../../../..${hostObject}`])
      expect(commandExists(probe, app)).toBe(false);
    // A link of the app's that climbs out through a system folder's link (the build refuses to leave one; a
    // deployment that had one still tells nothing): existing and missing host files read alike.
    await symlink(`${link0()}/../../..`, path.join(app, "l"));
    for (const probe of [hostObject, `${hostObject}-missing`]) expect(commandExists(`/app/l${probe}`, app)).toBe(false);
    // A link of the system folders that leads out of them on the host: the file it leads to is not in a sandbox.
    const link = "/usr/share/skiff-security-test-link";
    await rm(link, { force: true });
    await symlink(path.dirname(hostObject), link);
    try {
      expect(commandExists(`${link}/${path.basename(hostObject)}`, app)).toBe(false);
    } finally {
      await rm(link, { force: true });
    }
  });

  it("a file descriptor skiff inherited (its launcher's) never reaches an app", async () => {
    // A process started with a file of its launcher's open on fd 57, as a shell's `exec 57<file` leaves it.
    const script = [
      `import { DEFAULT_SANDBOX_LIMITS, spawnSandboxed } from ${JSON.stringify(SANDBOX_MODULE)};`,
      `import { configureSandbox } from ${JSON.stringify(SETUP_MODULE)};`,
      "const l = DEFAULT_SANDBOX_LIMITS;",
      "const o = configureSandbox({ sandbox: 'on', replicaMemoryMb: 1024, replicaPids: l.pids, replicaFileMb: l.fileMb,",
      "  replicaTmpMb: l.tmpMb, replicaCpuSeconds: 0, replicaOpenFiles: l.openFiles, replicaNetwork: 'none' },",
      "  { warn: (o, m) => console.error(m), info: () => undefined });",
      "const p = spawnSandboxed(o.host, { appDir: '/usr/share', uid: 1234569, limits: o.limits, command: '/bin/ls', args: ['/proc/self/fd'], env: {} });",
      "p.child.stdout.pipe(process.stdout);",
    ].join("\n");
    await writeFile(path.join(tmp, "fds.mts"), script);
    const out = execFileSync("/bin/bash", ["-c", `exec 57<${hostObject}; exec npx tsx ${path.join(tmp, "fds.mts")}`], {
      cwd: path.resolve(import.meta.dirname, "../.."),
      encoding: "utf8",
      stdio: ["ignore", "pipe", "pipe"],
    });
    expect(out.split("\n").filter(Boolean)).toEqual(["0", "1", "2"]);
  }, 30_000);

  it("slirp4netns runs with its own sandbox and seccomp filter, and no scratch folder is left in /tmp", async () => {
    // The temporary folder of this process is one of its own for the test: whatever the sandbox's set-up leaves
    // there is its own (other test files, running beside it, make folders in the machine's /tmp).
    const scratch = await mkdtemp(path.join(tmpdir(), "skiff-slirp-scratch-"));
    const savedTmp = process.env.TMPDIR;
    process.env.TMPDIR = scratch;
    let out = "";
    try {
      const sandboxed = spawnSandboxed(SANDBOX.host, {
        appDir: tmp,
        uid: 1_234_568,
        limits: SANDBOX.limits,
        command: "/bin/sh",
        args: ["-c", "cat /etc/resolv.conf; sleep 3"],
        env: {},
        network: "slirp4netns",
      });
      sandboxed.child.stdout!.on("data", (c: Buffer) => (out += c.toString()));
      await new Promise<void>((resolve) => sandboxed.child.stdout!.once("data", () => resolve()));
      const slirp = (await readdir("/proc")).filter((p) => /^\d+$/.test(p));
      let seen = 0;
      for (const pid of slirp) {
        const cmd = await readFile(`/proc/${pid}/cmdline`, "utf8").catch(() => "");
        if (!cmd.startsWith("/usr/bin/slirp4netns") || !cmd.includes(String(sandboxed.initPid()))) continue;
        seen++;
        expect(cmd.split("\0")).toEqual(expect.arrayContaining(["--enable-sandbox", "--enable-seccomp"]));
        expect(await readFile(`/proc/${pid}/status`, "utf8")).toMatch(/^Seccomp:\s+2$/m);
      }
      expect(seen).toBe(1);
      await new Promise((resolve) => sandboxed.child.on("close", resolve));
    } finally {
      if (savedTmp === undefined) delete process.env.TMPDIR;
      else process.env.TMPDIR = savedTmp;
    }
    expect(out).toContain("nameserver 10.0.2.3");
    expect(await readdir(scratch)).toEqual([]);
    await rm(scratch, { recursive: true, force: true });
  });
});
