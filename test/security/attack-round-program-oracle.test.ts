// A Custom app's program is looked for at the deploy (services/runner/
// prepare.ts, commandExists), on a search path that starts with the app's
// venv's bin (cerebrium.toml's pip dependencies), and the refusal says it is
// missing. Attacked as a tenant who wants that answer to tell which host files
// exist outside what a sandbox sees: links its build commands leave in the
// venv's bin (to host folders through the system folders' own links out,
// climbing, absolute /app targets), ".." and absolute names. Every probe of an
// existing host file must read as the probe of a missing one. Real skiff, real
// sandboxed builds, deploys over REST.
import { mkdir, mkdtemp, rm, writeFile } from "node:fs/promises";
import { existsSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import { c as createTar } from "tar";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { startTestSkiff, type TestSkiff } from "../helpers/skiff.js";

const P = "p-dev";

let t: TestSkiff;
let tmp: string;
let n = 0;

/** Deploys a Custom app whose venv holds pyyaml (from Debian, offline), built with `shell`, running `command`. */
async function deploy(command: string[], shell: string[]): Promise<{ status: number; message: string }> {
  const name = `oracle-${++n}`;
  const dir = path.join(tmp, name);
  await mkdir(dir, { recursive: true });
  const toml = [
    "[cerebrium.deployment]",
    `name = "${name}"`,
    `shell_commands = ${JSON.stringify(shell)}`,
    "",
    "[cerebrium.runtime.custom]",
    "port = 8000",
    `entrypoint = ${JSON.stringify(command)}`,
    "",
    "[cerebrium.scaling]",
    "min_replicas = 0",
    "",
    "[cerebrium.dependencies.pip]",
    'pyyaml = "latest"',
    "",
  ].join("\n");
  await writeFile(path.join(dir, "cerebrium.toml"), toml);
  await writeFile(path.join(dir, "main.py"), "");
  const chunks: Buffer[] = [];
  for await (const chunk of createTar({ gzip: true, cwd: dir, portable: true }, ["cerebrium.toml", "main.py"]))
    chunks.push(Buffer.from(chunk as Uint8Array));
  const res = await fetch(`${t.url}/v2/projects/${P}/apps`, {
    method: "POST",
    headers: { authorization: `Bearer ${t.devToken}`, "content-type": "application/gzip" },
    body: Buffer.concat(chunks),
  });
  const body = (await res.json()) as { message?: string };
  return { status: res.status, message: String(body.message ?? "") };
}

/** The refusal with the probe's own text taken out: what is left must not depend on the host. */
const shape = (answer: { status: number; message: string }, ...names: string[]) => {
  let m = answer.message;
  for (const s of names) m = m.split(JSON.stringify(s).slice(1, -1)).join("<probe>").split(s).join("<probe>");
  return `${answer.status} ${m}`;
};

const BIN = ".skiff/venv/bin";

beforeAll(async () => {
  tmp = await mkdtemp(path.join(tmpdir(), "skiff-attack-oracle-"));
  t = await startTestSkiff();
}, 120_000);
afterAll(async () => {
  await t?.close();
  await rm(tmp, { recursive: true, force: true });
});

describe("attack - the deploy's program check as an oracle of host files", () => {
  it("a program of the venv (made by the build) is found; a misspelt one is refused", async () => {
    const ok = await deploy(["served"], [`printf '#!/bin/sh\\n' > ${BIN}/served && chmod 755 ${BIN}/served`]);
    expect(ok.status, ok.message).toBe(200);
    const typo = await deploy(["servedd"], [`printf '#!/bin/sh\\n' > ${BIN}/served && chmod 755 ${BIN}/served`]);
    expect(typo.status).toBe(400);
    expect(typo.message).toMatch(/is not a program on a replica's PATH/);
  }, 120_000);

  it("links in the venv's bin through a system folder's link out (/usr/lib/ssl/private -> /etc/ssl/private): existing and missing host files read alike", async () => {
    // On this host /usr/lib/ssl/private leads to /etc/ssl/private (root's, 0700), which no sandbox sees.
    expect(existsSync("/etc/ssl/private")).toBe(true);
    const answers: string[] = [];
    for (const [target, probe] of [
      ["/usr/lib/ssl/private", "probe-x"],
      ["/usr/lib/ssl/private-missing", "probe-x"],
      ["/usr/lib/ssl/certs", "probe-x"],
      ["/usr/lib/ssl/certs/no-such-cert.pem", "probe-x"],
    ]) {
      const answer = await deploy([probe], [`ln -s ${target} ${BIN}/${probe}`]);
      answers.push(shape(answer, target, probe));
    }
    expect(new Set(answers).size, answers.join("\n")).toBe(1);
    expect(answers[0]).toMatch(/^400 .*is not a program on a replica's PATH/);
  }, 180_000);

  it("links that climb (relative or absolute, /app/..) are refused by their shape, whatever the host holds", async () => {
    const answers: string[] = [];
    for (const target of [
      "/usr/lib/ssl/private/../../../../etc/passwd",
      "/usr/lib/ssl/private/../../../../etc/passwd-missing",
      "../../../../../../etc/passwd",
      "../../../../../../etc/passwd-missing",
      "/app/../etc/passwd",
      "/app/../etc/passwd-missing",
    ]) {
      const answer = await deploy(["probe-x"], [`ln -s ${target} ${BIN}/probe-x`]);
      answers.push(shape(answer, target).replace(/-missing/g, ""));
    }
    // Pairs: a host file that exists and one that does not give the same answer.
    for (let i = 0; i < answers.length; i += 2) expect(answers[i]).toBe(answers[i + 1]);
    for (const a of answers) expect(a).not.toMatch(/^200/);
  }, 180_000);

  it("names with .., absolute host paths and /app/.. paths read alike for files that exist and files that do not", async () => {
    const pairs: [string, string][] = [
      ["/etc/passwd", "/etc/passwd-missing"],
      ["/etc/ssl/private", "/etc/ssl/private-missing"],
      ["../../../../etc/passwd", "../../../../etc/passwd-missing"],
      ["/app/../../../../etc/passwd", "/app/../../../../etc/passwd-missing"],
      ["/usr/lib/ssl/private/../../../../etc/passwd", "/usr/lib/ssl/private/../../../../etc/passwd-missing"],
      [`${t.dataDir}/admin-token`, `${t.dataDir}/admin-token-missing`],
    ];
    for (const [there, missing] of pairs) {
      const a = await deploy([there], []);
      const b = await deploy([missing], []);
      expect(shape(a, there), there).toBe(shape(b, missing));
      expect(a.status, a.message).not.toBe(200);
    }
  }, 300_000);
});
