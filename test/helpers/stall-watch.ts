// A reporter that ends a test run which has stopped moving. Every test and
// hook has a deadline (vitest.config.ts), so a run in which nothing has
// started or ended for many minutes, between its start and its end, is stuck
// where no deadline reaches: a worker whose event loop is blocked, a child it
// waits on synchronously, or the run itself after its last file. Such a run would otherwise sit until CI's own limit and say
// nothing; this one says what was in flight, for how long, and which
// processes were below the test run and in what state, then ends with exit
// code 1.
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
  /** What the report says of the processes below the run (by default read from /proc). */
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
    clearInterval(this.timer);
  }

  /** Reports and ends the run when, between its start and its end, nothing has started or ended for the stall time; true then. */
  check(): boolean {
    const now = this.now();
    if (!this.running || now - this.lastMoved < this.stallMs) return false;
    clearInterval(this.timer);
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

interface Proc {
  ppid: number;
  /** As /proc/<pid>/stat has it: R, S, D, Z... */
  state: string;
}

/** Every process of the machine, by pid. */
function processTable(): Map<number, Proc> {
  const table = new Map<number, Proc>();
  for (const name of readdirSync("/proc")) {
    if (!/^\d+$/.test(name)) continue;
    const stat = readProc(Number(name), "stat");
    // After the command's name, in parentheses: state, parent, ...
    const [state, ppid] = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
    if (state) table.set(Number(name), { ppid: Number(ppid), state });
  }
  return table;
}

/** The pids below `root`, parents before their children. */
function descendants(table: Map<number, Proc>, root: number): number[] {
  const found: number[] = [];
  let frontier = [root];
  while (frontier.length > 0) {
    const next: number[] = [];
    for (const [pid, p] of table) if (frontier.includes(p.ppid)) next.push(pid);
    found.push(...next);
    frontier = next;
  }
  return found;
}

/** The processes below this one, and every process of the machine waiting in the kernel (state D). */
function processesBelow(): string {
  const table = processTable();
  const row = (pid: number) =>
    `  ${pid} ${table.get(pid)!.state} ${readProc(pid, "wchan") || "-"} ` +
    readProc(pid, "cmdline").replaceAll("\0", " ").trim().slice(0, 300);
  const waiting = [...table].filter(([, p]) => p.state === "D").map(([pid]) => row(pid));
  return (
    `Processes below the test run (pid state wchan command):\n${descendants(table, process.pid).map(row).join("\n")}\n` +
    `Processes waiting in the kernel (state D):\n${waiting.join("\n")}`
  );
}

function readProc(pid: number, file: string): string {
  try {
    return readFileSync(`/proc/${pid}/${file}`, "utf8");
  } catch {
    return "";
  }
}

function endRun(): void {
  for (const pid of descendants(processTable(), process.pid).reverse()) {
    try {
      process.kill(pid, "SIGKILL");
    } catch {
      // gone already
    }
  }
  process.exit(1);
}
