// README, read top to bottom, against what the programs print. Every ```sh
// block of README.md that shows output is run, in order, as a new user would
// type it: in an empty folder whose `.data` is the data folder of a skiff
// started as `npm start` starts it (its own nats-server, the example apps
// deployed). A `# ` line under a command is what that command prints, one
// line each, in order (stdout and stderr together); `…` stands for what varies
// (ids, times, sizes). Blocks without such lines claim nothing and are not
// run. A command that only reads (no POST, deploy, create or delete) is
// tried again for a while, as its answer may need a moment (an async run).
import { spawn, type ChildProcess } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync, symlinkSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import { createInterface } from "node:readline";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { EXAMPLE_APPS } from "../../services/management/examples.js";
import { SKIFF_SERVER } from "../helpers/paths.js";

const root = path.resolve(import.meta.dirname, "../..");

interface Step {
  /** The command as README writes it (continuation lines joined). */
  command: string;
  /** The lines it prints, as README shows them. */
  expected: string[];
  /** README line of the command. */
  line: number;
}

/** The steps of every ```sh block that shows output, in README's order. */
export function readmeSteps(text: string): Step[] {
  const steps: Step[] = [];
  const lines = text.split("\n");
  for (let i = 0; i < lines.length; i++) {
    if (lines[i] !== "```sh") continue;
    const block: Step[] = [];
    for (i++; i < lines.length && lines[i] !== "```"; i++) {
      const line = lines[i];
      if (line.startsWith("# ")) {
        if (block.length === 0) throw new Error(`README.md:${i + 1}: output shown before any command`);
        block.at(-1)!.expected.push(line.slice(2));
      } else if (line.trim() !== "") {
        let command = line;
        const start = i + 1;
        while (command.endsWith("\\") && i + 1 < lines.length) command += "\n" + lines[++i];
        block.push({ command, expected: [], line: start });
      }
    }
    if (block.some((s) => s.expected.length > 0)) steps.push(...block);
  }
  return steps;
}

/** A shown line as a pattern: `…` matches anything, the rest literally. */
const pattern = (shown: string) =>
  new RegExp(
    `^${shown
      .split("…")
      .map((part) => part.replace(/[.*+?^${}()|[\]\\]/g, "\\$&"))
      .join(".*")}$`,
  );

/** Node's own warnings on stderr are no part of what a program prints. */
const isNodeWarning = (line: string) =>
  /^\(node:\d+\) \w*Warning: /.test(line) || line.startsWith("(Use `node --trace-");

describe("README", () => {
  let skiff: ChildProcess;
  let exited: Promise<number | null>;
  let home: string;
  let port = "";
  const steps = readmeSteps(readFileSync(path.join(root, "README.md"), "utf8"));
  // Variables the steps set (TOKEN=…, RUN=…) live on from one step to the next, as in one shell.
  const variables = [...new Set(steps.flatMap((s) => /^([A-Z_]+)=/.exec(s.command)?.[1] ?? []))];

  beforeAll(async () => {
    home = mkdtempSync(path.join(tmpdir(), "skiff-readme-"));
    for (const name of ["examples", "node_modules", "package.json"])
      symlinkSync(path.join(root, name), path.join(home, name));
    // `npx skiff` is this checkout's CLI, never a package fetched from a registry.
    writeFileSync(
      path.join(home, ".readme-shell"),
      `npx() { if [ "$1" = skiff ]; then shift; node ${JSON.stringify(path.join(root, "bin", "skiff.js"))} "$@"; else command npx "$@"; fi; }\n`,
    );
    skiff = spawn(process.execPath, [SKIFF_SERVER], {
      cwd: root,
      env: {
        PATH: process.env.PATH,
        HOME: process.env.HOME,
        CI: "1",
        SKIFF_DATA_DIR: path.join(home, ".data"),
        SKIFF_PORT: "0",
      },
      stdio: ["ignore", "pipe", "ignore"],
    });
    exited = new Promise((resolve) => skiff.once("exit", (code) => resolve(code)));
    const deployed = new Set<string>();
    await new Promise<void>((resolve, reject) => {
      createInterface({ input: skiff.stdout! }).on("line", (text) => {
        let line: Record<string, unknown>;
        try {
          line = JSON.parse(text);
        } catch {
          return;
        }
        if (String(line.msg).startsWith("skiff serves")) port = new URL(String(line.url)).port;
        if (String(line.msg).startsWith("deployed example app")) deployed.add(String(line.app));
        if (port !== "" && EXAMPLE_APPS.every((a) => deployed.has(a))) resolve();
      });
      void exited.then((code) => reject(new Error(`skiff exited with ${code} before it served`)));
    });
  }, 180_000);
  afterAll(async () => {
    if (skiff && skiff.exitCode === null) {
      skiff.kill("SIGTERM");
      await exited;
    }
    if (home) rmSync(home, { recursive: true, force: true });
  });

  /** Runs one step in bash in the user's folder; its output lines, stdout and stderr together. */
  function runStep(step: Step): Promise<string[]> {
    const command = step.command.replace(/(localhost|127\.0\.0\.1):8080/g, `127.0.0.1:${port}`);
    const script = [
      "source ./.readme-shell",
      "[ -f ./.readme-vars ] && source ./.readme-vars",
      `{\n${command}\n} 2>&1`,
      "status=$?",
      variables.length > 0 ? `declare -p ${variables.join(" ")} > ./.readme-vars 2>/dev/null` : "",
      "exit $status",
    ].join("\n");
    return new Promise((resolve, reject) => {
      const bash = spawn("bash", ["-c", script], {
        cwd: home,
        env: { PATH: process.env.PATH, HOME: process.env.HOME },
        stdio: ["ignore", "pipe", "pipe"],
      });
      let out = "";
      bash.stdout.setEncoding("utf8").on("data", (c: string) => (out += c));
      bash.stderr.setEncoding("utf8").on("data", (c: string) => (out += c));
      const timer = setTimeout(() => bash.kill("SIGKILL"), 60_000);
      bash.once("error", reject);
      bash.once("close", () => {
        clearTimeout(timer);
        resolve(
          out
            .split("\n")
            .map((l) => l.replace(/\r$/, ""))
            .filter((l) => l.trim() !== "" && !isNodeWarning(l)),
        );
      });
    });
  }

  const matches = (expected: string[], actual: string[]) =>
    expected.length === actual.length && expected.every((e, k) => pattern(e).test(actual[k]));

  it("has shell examples that show output", () => {
    expect(steps.filter((s) => s.expected.length > 0).length).toBeGreaterThanOrEqual(8);
  });

  it("prints what README shows, command by command", async () => {
    for (const step of steps) {
      const readOnly = !/POST|deploy|delete|create|=\$\(/.test(step.command);
      const deadline = Date.now() + (readOnly ? 30_000 : 0);
      let actual = await runStep(step);
      while (step.expected.length > 0 && !matches(step.expected, actual) && Date.now() < deadline) {
        await new Promise((resolve) => setTimeout(resolve, 1_000));
        actual = await runStep(step);
      }
      if (step.expected.length > 0)
        expect({ line: step.line, command: step.command, printed: actual }).toEqual({
          line: step.line,
          command: step.command,
          printed: step.expected.map((e, k) => (pattern(e).test(actual[k] ?? "") ? actual[k] : e)),
        });
    }
  }, 600_000);
});
