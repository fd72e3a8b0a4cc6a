// A sandbox's way out (SKIFF_REPLICA_NETWORK=slirp4netns): slirp4netns gives
// its network namespace a tap device with a route out, never to the host's
// loopback, and rules added from outside before anything of the app runs
// there refuse the host's own addresses and the denied ranges.
import { spawn, type ChildProcess } from "node:child_process";
import { existsSync } from "node:fs";
import { readFile } from "node:fs/promises";
import { networkInterfaces } from "node:os";
import { joinOrKill, type SandboxCgroup } from "./cgroups.js";
import { runsAsRoot, STAGE_ENV } from "./sandbox-argv.js";

const SLIRP_CANDIDATES = ["/usr/bin/slirp4netns", "/usr/local/bin/slirp4netns"];
/** The DNS forwarder slirp4netns offers inside the namespace. */
const SLIRP_DNS = "10.0.2.3";
const NSENTER_CANDIDATES = ["/usr/bin/nsenter", "/bin/nsenter"];
const IP_CANDIDATES = ["/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"];
/** Priority of the namespace's rules that refuse the host's addresses: before the main table's (32766). */
const DENY_RULE_PRIORITY = 100;

/** The resolv.conf of a sandbox with slirp4netns: its DNS forwarder (the host's may name a loopback resolver). */
export const SLIRP_RESOLV_CONF = `nameserver ${SLIRP_DNS}\n`;

const findTool = (candidates: string[]) => candidates.find((p) => existsSync(p));

export function slirpPath(): string | undefined {
  return findTool(SLIRP_CANDIDATES);
}

/** Whether nsenter and ip, which add the refusing rules, are here. */
export const denyToolsPresent = (): boolean => !!findTool(NSENTER_CANDIDATES) && !!findTool(IP_CANDIDATES);

/**
 * The destinations a replica with outbound network must not reach: every
 * IPv4 address the host has now (slirp4netns connects from the host's own
 * stack, where a service bound to 0.0.0.0 or to one of them would answer;
 * the host's loopback is refused by slirp4netns itself) and the configured
 * ranges (`deniedCidrs`, SKIFF_REPLICA_DENIED_CIDRS). slirp4netns runs
 * without IPv6, so a replica has no IPv6 route out.
 */
export function deniedDestinations(deniedCidrs: readonly string[]): string[] {
  const own = Object.values(networkInterfaces())
    .flat()
    .filter((a) => a !== undefined && a.family === "IPv4" && !a.address.startsWith("127."))
    .map((a) => `${a!.address}/32`);
  return [...new Set([...own, ...deniedCidrs])];
}

/**
 * Adds, from outside, rules to the network namespace of `pid` that refuse
 * (EACCES) every destination of `denied`, before anything of the app runs
 * there. The app cannot take them out: it has no CAP_NET_ADMIN over that
 * namespace (a host uid without capabilities when skiff is root; otherwise a
 * user namespace in which bwrap dropped every capability, with no nested
 * ones).
 */
function denyDestinations(pid: number, denied: string[]): Promise<void> {
  const nsenter = findTool(NSENTER_CANDIDATES);
  const ip = findTool(IP_CANDIDATES);
  if (!nsenter || !ip) return Promise.reject(new Error("nsenter (util-linux) or ip (iproute2) is missing"));
  const ns = (kind: string) => `--${kind}=/proc/${pid}/ns/${kind === "user" ? "user" : "net"}`;
  const args = runsAsRoot() ? [ns("net")] : ["--preserve-credentials", ns("user"), ns("net")];
  const batch = denied.map((cidr) => `rule add prohibit to ${cidr} priority ${DENY_RULE_PRIORITY}\n`).join("");
  return new Promise((resolve, reject) => {
    const p = spawn(nsenter, [...args, ip, "-batch", "-"], { stdio: ["pipe", "ignore", "pipe"] });
    let stderr = "";
    p.stderr!.on("data", (d: Buffer) => (stderr += d.toString()));
    p.on("error", reject);
    p.on("close", (code) =>
      code === 0 ? resolve() : reject(new Error(`cannot keep the replica off the host's addresses: ${stderr.trim()}`)),
    );
    p.stdin!.on("error", () => undefined);
    p.stdin!.end(batch);
  });
}

/**
 * Waits (up to a second) until bwrap has set up the loopback of the
 * namespace of `pid`: slirp4netns configuring it at the same time makes
 * bwrap's own setup fail.
 */
async function loopbackUp(pid: number): Promise<void> {
  const read = (name: string) => readFile(`/proc/${pid}/net/${name}`, "utf8").catch(() => undefined);
  const deadline = Date.now() + 1000;
  while (Date.now() < deadline) {
    const v4 = (await read("fib_trie"))?.includes("127.0.0.1");
    const v6 = await read("if_inet6");
    // With IPv6, lo has ::1 once it is up, bwrap's last step; without, the address is the sign.
    if (v4 && (v6 === undefined || / lo$/m.test(v6))) return;
    await new Promise((r) => setTimeout(r, 1));
  }
}

/**
 * Connects the network namespace of `pid` (the first process of `sandbox`)
 * to the outside world through slirp4netns, then refuses what `denied` gives
 * (read then) in it;
 * calls `up` once both are done, `failed` (with slirp4netns stopped) when
 * either fails. slirp4netns exits when its exit fd closes: when the sandbox
 * ends, or when this process does. With `cgroup`, it runs in the sandbox's.
 */
export async function connectOutside(
  slirp: string,
  pid: number,
  sandbox: ChildProcess,
  denied: () => string[],
  done: { up: () => void; failed: (why: string) => void; isUp: () => boolean },
  cgroup?: SandboxCgroup,
): Promise<void> {
  await loopbackUp(pid);
  const net = spawn(
    slirp,
    [
      "--configure",
      "--mtu=65520",
      "--disable-host-loopback",
      // Its own mount namespace with little visible, and a seccomp filter of its own.
      "--enable-sandbox",
      "--enable-seccomp",
      "--ready-fd=3",
      "--exit-fd=4",
      // By path, not pid: given a pid it joins the process's user namespace first, where it may not set up the
      // network namespace (bwrap's own, when bwrap runs as the sandbox's uid).
      "--netns-type=path",
      `/proc/${pid}/ns/net`,
      "tap0",
    ],
    { stdio: ["ignore", "ignore", "ignore", "pipe", "pipe"], env: STAGE_ENV },
  );
  // In the sandbox's cgroup: it carries all of the sandbox's outbound traffic, with a host socket and buffers per
  // connection, which count against the sandbox's memory and processes then, not the host's. (The helper it forks
  // at once to open the tap device in the namespace may be forked before; it exits as soon as it has.)
  const notJoined = cgroup && joinOrKill(cgroup, net);
  if (notJoined) return done.failed(`cannot put slirp4netns in the sandbox's cgroup: ${notJoined}`);
  const exitPipe = net.stdio[4] as NodeJS.WritableStream;
  exitPipe.on("error", () => undefined);
  const stopNet = () => {
    exitPipe.end();
    if (net.exitCode === null) net.kill("SIGTERM");
  };
  if (sandbox.exitCode !== null || sandbox.signalCode !== null) stopNet();
  else sandbox.on("exit", stopNet);
  const netFailed = (why: string) => {
    stopNet();
    done.failed(why);
  };
  net.on("error", (err) => netFailed(`slirp4netns: ${err.message}`));
  net.on("exit", () => {
    if (!done.isUp()) netFailed("slirp4netns ended before the network was up");
  });
  // Until the host's own addresses are refused in the namespace, the command does not run.
  (net.stdio[3] as NodeJS.ReadableStream).once("data", () => {
    denyDestinations(pid, denied()).then(done.up, (err: Error) => netFailed(err.message));
  });
}
