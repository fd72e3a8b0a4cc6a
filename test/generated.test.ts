import { execFileSync } from "node:child_process";
import { mkdtempSync, readdirSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, relative } from "node:path";
import { afterAll, describe, expect, it } from "vitest";

const root = join(import.meta.dirname, "..");

function files(dir: string, skip: (rel: string) => boolean = () => false): Map<string, string> {
  const out = new Map<string, string>();
  const walk = (d: string) => {
    for (const e of readdirSync(d, { withFileTypes: true })) {
      const p = join(d, e.name);
      const rel = relative(dir, p);
      if (skip(rel)) continue;
      if (e.isDirectory()) walk(p);
      else out.set(rel, readFileSync(p, "utf8"));
    }
  };
  walk(dir);
  return out;
}

describe("generated code", () => {
  const tmp = mkdtempSync(join(tmpdir(), "skiff-gen-"));
  afterAll(() => rmSync(tmp, { recursive: true, force: true }));

  it("gen/ is exactly what buf generate makes from proto/ (run `npm run generate` when this fails)", () => {
    execFileSync(join(root, "node_modules/.bin/buf"), ["generate", "-o", tmp], { cwd: root, stdio: "pipe" });
    const fresh = files(join(tmp, "gen"));
    const committed = files(join(root, "gen"), (rel) => rel.startsWith("openapi"));
    expect([...committed.keys()].sort()).toEqual([...fresh.keys()].sort());
    for (const [rel, text] of fresh) expect(committed.get(rel), rel).toBe(text);
  });
});
