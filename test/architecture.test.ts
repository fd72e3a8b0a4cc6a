// The import graph of services/: dependencies point one way (roles →
// domains → nats, server → config), a folder is entered only through its
// index.ts, and no two folders import each other, directly or in a ring.
import { readdirSync, readFileSync } from "node:fs";
import path from "node:path";
import { describe, expect, it } from "vitest";

const SERVICES = path.resolve(import.meta.dirname, "..", "services");

/** Layers, lowest first: a folder may import only from lower layers, or from its own layer where `peers` says so. */
const LAYERS: { folders: string[]; peers: boolean }[] = [
  { folders: ["config", "metrics"], peers: false },
  { folders: ["nats", "server"], peers: false },
  { folders: ["auth", "apps", "runs", "runner-client"], peers: true },
  { folders: ["invocation", "management", "runner", "webhook"], peers: true },
  { folders: ["cli", "(top)"], peers: false },
];
/**
 * Modules free of skiff's own imports that the CLI and browser code import
 * directly, to keep what they load small. The dashboard may import only these
 * and generated code.
 */
const LEAF_MODULES = ["runs/status.ts", "auth/bearer.ts"];

function layerOf(folder: string): number {
  const i = LAYERS.findIndex((l) => l.folders.includes(folder));
  if (i < 0) throw new Error(`services/${folder} belongs to no layer: add it to LAYERS`);
  return i;
}

function sourceFiles(dir: string): string[] {
  return readdirSync(dir, { withFileTypes: true }).flatMap((e) => {
    const p = path.join(dir, e.name);
    if (e.isDirectory())
      return e.name === "node_modules" || e.name === "dist" || e.name === "shims" ? [] : sourceFiles(p);
    return /\.tsx?$/.test(e.name) && !e.name.endsWith(".d.ts") ? [p] : [];
  });
}

/** services/<folder>/…, or "(top)" for main.ts and start.ts. */
function folderOf(file: string): string {
  const parts = path.relative(SERVICES, file).split(path.sep);
  return parts.length === 1 ? "(top)" : parts[0];
}

interface Edge {
  from: string;
  to: string;
  spec: string;
}

function importsOf(file: string): Edge[] {
  const text = readFileSync(file, "utf8");
  const specs = [
    ...text.matchAll(/(?:^|\n)\s*(?:import|export)\b[^;]*?\bfrom\s*["']([^"']+)["']|import\(\s*["']([^"']+)["']\s*\)/g),
  ].map((m) => m[1] ?? m[2]);
  return specs
    .filter((s) => s.startsWith("."))
    .map((spec) => ({ from: file, to: path.resolve(path.dirname(file), spec).replace(/\.js$/, ".ts"), spec }));
}

const files = sourceFiles(SERVICES);
const edges = files.flatMap(importsOf).filter((e) => e.to.startsWith(SERVICES + path.sep));
const crossing = edges.filter((e) => folderOf(e.from) !== folderOf(e.to));
const show = (e: Edge) => `${path.relative(SERVICES, e.from)} imports ${e.spec}`;

describe("architecture - the import graph of services/", () => {
  it("finds the folders and their imports (the test reads what it checks)", () => {
    expect(files.length).toBeGreaterThan(50);
    expect(crossing.length).toBeGreaterThan(30);
    const folders = new Set(files.map(folderOf));
    for (const f of folders) if (f !== "dashboard") layerOf(f);
  });

  it("every folder but the dashboard is entered through its index.ts (or a leaf module)", () => {
    const bad = crossing.filter(
      (e) =>
        folderOf(e.from) !== "dashboard" &&
        path.relative(path.join(SERVICES, folderOf(e.to)), e.to) !== "index.ts" &&
        !LEAF_MODULES.includes(path.relative(SERVICES, e.to)),
    );
    expect(bad.map(show)).toEqual([]);
  });

  it("dependencies point down: roles → domains → nats, server → config; peers only where allowed", () => {
    const bad = crossing.filter((e) => {
      const [from, to] = [folderOf(e.from), folderOf(e.to)];
      if (from === "dashboard" || to === "(top)") return from !== "dashboard" && to === "(top)";
      const [lf, lt] = [layerOf(from), layerOf(to)];
      return lt > lf || (lt === lf && !LAYERS[lf].peers);
    });
    expect(bad.map(show)).toEqual([]);
  });

  it("no two folders depend on each other, directly or in a ring", () => {
    const graph = new Map<string, Set<string>>();
    for (const e of crossing) {
      const from = folderOf(e.from);
      if (!graph.has(from)) graph.set(from, new Set());
      graph.get(from)!.add(folderOf(e.to));
    }
    const rings: string[] = [];
    const state = new Map<string, "open" | "done">();
    const visit = (node: string, trail: string[]): void => {
      if (state.get(node) === "done") return;
      if (state.get(node) === "open") return void rings.push([...trail.slice(trail.indexOf(node)), node].join(" → "));
      state.set(node, "open");
      for (const next of graph.get(node) ?? []) visit(next, [...trail, node]);
      state.set(node, "done");
    };
    for (const node of graph.keys()) visit(node, []);
    expect(rings).toEqual([]);
  });

  it("the dashboard (browser code) imports only generated code and import-free modules", () => {
    const bad = edges.filter(
      (e) =>
        folderOf(e.from) === "dashboard" &&
        folderOf(e.to) !== "dashboard" &&
        !LEAF_MODULES.includes(path.relative(SERVICES, e.to)),
    );
    expect(bad.map(show)).toEqual([]);
    for (const allowed of LEAF_MODULES) expect(importsOf(path.join(SERVICES, allowed))).toEqual([]);
  });

  it("the configuration's import closure stays free of domains and roles (the CLI loads it)", () => {
    const closure = new Set<string>();
    const walk = (file: string) => {
      if (closure.has(file)) return;
      closure.add(file);
      for (const e of importsOf(file)) if (e.to.startsWith(SERVICES)) walk(e.to);
    };
    walk(path.join(SERVICES, "config", "index.ts"));
    expect([...closure].map((f) => folderOf(f)).filter((f) => f !== "config")).toEqual([]);
  });
});
