// A reporter that ends a test run which has stopped moving. Every test and
// hook has a deadline (vitest.config.ts), so a run in which nothing has
// started or ended for many minutes, between its start and its end, is stuck
// where no deadline reaches: a worker whose event loop is blocked, a child it
// waits on synchronously, or the run itself after its last file. Such a run would otherwise sit until CI's own limit and say
// nothing; this one says what was in flight, for how long, and which
// processes were below the test run and in what state, then ends with exit
// code 1.
import { execFileSync } from "node:child_process";
import { readdirSync, readFileSync } from "node:fs";
import type { Reporter, ReportedHookContext, TestCase, TestModule } from "vitest/node";

/** Minutes without any test, hook or file starting or ending, before a run that has started and not ended is called stuck. */
const DEFAULT_STALL_MINUTES = 10;

export interface StallWatchOptions {
  stallMs?: number;
  now?: () => number;
  /** Where the report goes. */
  write?: (text: string) => void;
  /** What ends the run once it is reported; by default the processes below this one are killed and it exits 1. */
  end?: () => void;
  /** What the report says of the processes below the run (by default read from /proc and ps). */
  processes?: () => string;
  /** How often the watch looks; 0: only when check() is called (tests). */
  intervalMs?: number;
}

interface InFlight {
  what: string;
  since: number;
}

export default class StallWatch implements Reporter {
  private readonly stallMs: number;
  private readonly now: () => number;
  private readonly write: (text: string) => void;
  private readonly end: () => void;
  private readonly processes: () => string;
  private readonly inFlight = new Map<string, InFlight>();
  private lastMoved: number;
  /** Between the run's start and its end. */
  private running = false;
  private timer: NodeJS.Timeout | undefined;

  constructor(options: StallWatchOptions = {}) {
    const minutes = Number(process.env.SKIFF_TEST_STALL_MINUTES ?? DEFAULT_STALL_MINUTES);
    this.stallMs = options.stallMs ?? (minutes > 0 ? minutes : DEFAULT_STALL_MINUTES) * 60_000;
    this.now = options.now ?? Date.now;
    this.write = options.write ?? ((text) => process.stderr.write(text));
    this.end = options.end ?? endRun;
    this.processes = options.processes ?? processesBelow;
    this.lastMoved = this.now();
    const interval = options.intervalMs ?? Math.min(30_000, this.stallMs / 4);
    if (interval > 0) {
      this.timer = setInterval(() => this.check(), interval);
      this.timer.unref();
    }
  }

  onTestRunStart(): void {
    this.running = true;
    this.lastMoved = this.now();
  }
  onTestModuleStart(module: TestModule): void {
    this.running = true;
    this.begin(`file:${module.moduleId}`, `${module.project.name} ${module.relativeModuleId}`);
  }
  onTestModuleEnd(module: TestModule): void {
    this.finish(`file:${module.moduleId}`);
  }
  onTestCaseReady(test: TestCase): void {
    this.begin(`test:${test.id}`, `test "${test.fullName}" (${test.module.relativeModuleId})`);
  }
  onTestCaseResult(test: TestCase): void {
    this.finish(`test:${test.id}`);
  }
  onHookStart(hook: ReportedHookContext): void {
    this.begin(hookKey(hook), `${hook.name} of ${entityName(hook)}`);
  }
  onHookEnd(hook: ReportedHookContext): void {
    this.finish(hookKey(hook));
  }
  onTestRunEnd(): void {
    this.running = false;
    if (this.timer) clearInterval(this.timer);
    this.timer = undefined;
  }

  /** Reports and ends the run when, between its start and its end, nothing has started or ended for the stall time; true then. */
  check(): boolean {
    const now = this.now();
    if (!this.running || now - this.lastMoved < this.stallMs) return false;
    if (this.timer) clearInterval(this.timer);
    this.timer = undefined;
    const lines = [...this.inFlight.values()]
      .sort((a, b) => a.since - b.since)
      .map((f) => `  ${Math.round((now - f.since) / 1000)} s: ${f.what}`);
    if (lines.length === 0) lines.push("  nothing: every file has ended, the run has not");
    this.write(
      `\nThe test run is stuck: nothing has started or ended for ${((now - this.lastMoved) / 60_000).toFixed(1)} minutes. ` +
        `In flight, the longest first:\n${lines.join("\n")}\n${this.processes()}\n`,
    );
    this.end();
    return true;
  }

  private begin(key: string, what: string): void {
    this.inFlight.set(key, { what, since: this.now() });
    this.lastMoved = this.now();
  }
  private finish(key: string): void {
    this.inFlight.delete(key);
    this.lastMoved = this.now();
  }
}

function hookKey(hook: ReportedHookContext): string {
  return `hook:${hook.name}:${hook.entity.id}`;
}

function entityName(hook: ReportedHookContext): string {
  const e = hook.entity;
  if (e.type === "module") return e.relativeModuleId;
  return `"${e.fullName}" (${e.module.relativeModuleId})`;
}

/** The processes below this one: pid, parent, state, what the kernel waits in, the command line. */
function processesBelow(): string {
  const rows: string[] = [];
  for (const pid of descendants(process.pid)) {
    const stat = readProc(pid, "stat");
    const state = stat.slice(stat.lastIndexOf(")") + 2).split(" ")[0] ?? "?";
    const wchan = readProc(pid, "wchan") || "-";
    const cmd = readProc(pid, "cmdline").replaceAll("\0", " ").trim().slice(0, 300);
    rows.push(`  ${pid} ${state} ${wchan} ${cmd}`);
  }
  let dState = "";
  try {
    dState = execFileSync("ps", ["-eo", "pid,stat,wchan:30,etime,args"], { encoding: "utf8", timeout: 5000 })
      .split("\n")
      .filter((l, i) => i === 0 || /^\s*\d+\s+D/.test(l))
      .join("\n");
  } catch {
    // ps is missing: the list below this run is there anyway
  }
  return `Processes below the test run (pid state wchan command):\n${rows.join("\n")}\nProcesses waiting in the kernel (state D):\n${dState}`;
}

function descendants(root: number): number[] {
  const parentOf = new Map<number, number>();
  for (const name of readdirSync("/proc")) {
    if (!/^\d+$/.test(name)) continue;
    const stat = readProc(Number(name), "stat");
    const ppid = Number(stat.slice(stat.lastIndexOf(")") + 2).split(" ")[1]);
    if (Number.isFinite(ppid)) parentOf.set(Number(name), ppid);
  }
  const found: number[] = [];
  let frontier = [root];
  while (frontier.length > 0) {
    const next: number[] = [];
    for (const [pid, ppid] of parentOf) if (frontier.includes(ppid)) next.push(pid);
    found.push(...next);
    frontier = next;
  }
  return found;
}

function readProc(pid: number, file: string): string {
  try {
    return readFileSync(`/proc/${pid}/${file}`, "utf8");
  } catch {
    return "";
  }
}

function endRun(): void {
  for (const pid of descendants(process.pid).reverse()) {
    try {
      process.kill(pid, "SIGKILL");
    } catch {
      // gone already
    }
  }
  process.exit(1);
}
