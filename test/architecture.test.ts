// The import graph of services/: dependencies point one way (roles →
// domains → nats, server → config), a folder is entered only through its
// index.ts, no role imports another, no two folders import each other
// (directly or in a ring), no file is part of an import cycle, plumbing
// never imports skiff's own generated API, and the CLI loads only itself,
// generated code, the configuration and leaf modules.
import { readdirSync, readFileSync } from "node:fs";
import path from "node:path";
import { describe, expect, it } from "vitest";

const ROOT = path.resolve(import.meta.dirname, "..");
const SERVICES = path.join(ROOT, "services");
const GEN = path.join(ROOT, "gen");

/** Layers, lowest first: a folder may import only from lower layers, or from its own layer where `peers` says so. */
const LAYERS: { folders: string[]; peers: boolean }[] = [
  { folders: ["config", "metrics"], peers: false },
  { folders: ["nats", "server"], peers: false },
  { folders: ["auth", "apps", "runs", "webhooks", "secrets", "runner-client"], peers: true },
  { folders: ["invocation", "management", "runner", "webhook"], peers: false },
  { folders: ["cli", "(top)"], peers: false },
];
/**
 * Modules free of skiff's own imports that the CLI and browser code import
 * directly, to keep what they load small. The dashboard may import only these
 * and generated code.
 */
const LEAF_MODULES = [
  "runs/status.ts",
  "auth/bearer.ts",
  "apps/bundle.ts",
  "secrets/names.ts",
  "auth/account-rules.ts",
];
/** Plumbing: it may use the generated code of the standard protocols it speaks (gen/google/, gen/grpc/), never skiff's own API (gen/skiff/). */
const PLUMBING = ["config", "metrics", "nats", "server"];

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

/** Every module specifier a file imports or re-exports, statically or dynamically, `import type` included. */
function specifiersOf(file: string): string[] {
  const text = readFileSync(file, "utf8");
  return [
    ...text.matchAll(/(?:^|\n)\s*(?:import|export)\b[^;]*?\bfrom\s*["']([^"']+)["']|import\(\s*["']([^"']+)["']\s*\)/g),
  ].map((m) => m[1] ?? m[2]);
}

/** The file's imports of files of the checkout (services/, gen/). */
function importsOf(file: string): Edge[] {
  return specifiersOf(file)
    .filter((s) => s.startsWith("."))
    .map((spec) => ({ from: file, to: path.resolve(path.dirname(file), spec).replace(/\.js$/, ".ts"), spec }));
}

const files = sourceFiles(SERVICES);
const allEdges = files.flatMap(importsOf);
const edges = allEdges.filter((e) => e.to.startsWith(SERVICES + path.sep));
const crossing = edges.filter((e) => folderOf(e.from) !== folderOf(e.to));
const show = (e: Edge) => `${path.relative(SERVICES, e.from)} imports ${e.spec}`;

/** The files `entry` loads, itself included, following imports of the checkout's files. */
function closureOf(entry: string): Set<string> {
  const closure = new Set<string>();
  const walk = (file: string) => {
    if (closure.has(file)) return;
    closure.add(file);
    for (const e of importsOf(file)) if (e.to.startsWith(ROOT + path.sep)) walk(e.to);
  };
  walk(entry);
  return closure;
}

/**
 * The import cycles among `nodes`: each group of files that reach each other
 * (a strongly connected component), with one shortest cycle through it, a
 * path that starts and ends at one file.
 */
function cyclesOf(nodes: string[], next: (n: string) => string[]): { cycle: string[]; group: string[] }[] {
  // Tarjan's strongly connected components, then one cycle through each group of more than one file (or a self-import).
  const index = new Map<string, number>();
  const low = new Map<string, number>();
  const stack: string[] = [];
  const onStack = new Set<string>();
  const groups: string[][] = [];
  const connect = (v: string): void => {
    index.set(v, index.size);
    low.set(v, index.get(v)!);
    stack.push(v);
    onStack.add(v);
    for (const w of next(v)) {
      if (!index.has(w)) {
        connect(w);
        low.set(v, Math.min(low.get(v)!, low.get(w)!));
      } else if (onStack.has(w)) low.set(v, Math.min(low.get(v)!, index.get(w)!));
    }
    if (low.get(v) === index.get(v)) {
      const group: string[] = [];
      let w: string;
      do {
        w = stack.pop()!;
        onStack.delete(w);
        group.push(w);
      } while (w !== v);
      if (group.length > 1 || next(v).includes(v)) groups.push(group);
    }
  };
  for (const n of nodes) if (!index.has(n)) connect(n);
  return groups.map((group) => ({ cycle: cycleThrough(group, next), group }));
}

/** A shortest way from the group's first file back to itself, through the group only. */
function cycleThrough(group: string[], next: (n: string) => string[]): string[] {
  const start = [...group].sort()[0];
  const inGroup = new Set(group);
  const from = new Map<string, string>();
  const queue = [start];
  while (queue.length > 0) {
    const v = queue.shift()!;
    for (const w of next(v)) {
      if (!inGroup.has(w)) continue;
      if (w === start) {
        const trail = [v];
        while (trail[0] !== start) trail.unshift(from.get(trail[0])!);
        return [...trail, start];
      }
      if (!from.has(w)) {
        from.set(w, v);
        queue.push(w);
      }
    }
  }
  return group;
}

/** "a → b → a", and the group's other files when the cycle does not pass through them all. */
function showCycle(cycle: string[], group: string[]): string {
  const rel = (f: string) => path.relative(SERVICES, f);
  const others = group.filter((f) => !cycle.includes(f)).map(rel);
  return cycle.map(rel).join(" → ") + (others.length > 0 ? ` (in one group with ${others.sort().join(", ")})` : "");
}

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

  it("no role imports another role (the process wiring, start.ts, joins them)", () => {
    const roles = LAYERS.find((l) => l.folders.includes("runner"))!.folders;
    const bad = crossing.filter((e) => roles.includes(folderOf(e.from)) && roles.includes(folderOf(e.to)));
    expect(bad.map(show)).toEqual([]);
  });

  it("no file of services/ is part of an import cycle", () => {
    const next = new Map<string, string[]>();
    for (const e of edges) next.set(e.from, [...(next.get(e.from) ?? []), e.to]);
    const cycles = cyclesOf(files, (f) => next.get(f) ?? []);
    expect(cycles.map(({ cycle, group }) => showCycle(cycle, group))).toEqual([]);
  });

  it("plumbing imports none of skiff's own generated API (gen/skiff/), only the standard protocols it speaks", () => {
    const bad = allEdges.filter(
      (e) => PLUMBING.includes(folderOf(e.from)) && e.to.startsWith(path.join(GEN, "skiff") + path.sep),
    );
    expect(bad.map(show)).toEqual([]);
  });

  it("the CLI loads only itself, generated code, the configuration and leaf modules: no server, NATS, runner or role", () => {
    const closure = new Set(files.filter((f) => folderOf(f) === "cli").flatMap((f) => [...closureOf(f)]));
    const bad = [...closure]
      .filter(
        (f) =>
          !f.startsWith(GEN + path.sep) &&
          !["cli", "config"].includes(folderOf(f)) &&
          !LEAF_MODULES.includes(path.relative(SERVICES, f)),
      )
      .map((f) => path.relative(ROOT, f));
    expect(bad).toEqual([]);
    const packages = new Set([...closure].flatMap((f) => specifiersOf(f).filter((s) => !s.startsWith("."))));
    expect([...packages].filter((p) => p === "nats" || p.startsWith("nats/"))).toEqual([]);
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
    const closure = closureOf(path.join(SERVICES, "config", "index.ts"));
    expect([...closure].map((f) => folderOf(f)).filter((f) => f !== "config")).toEqual([]);
  });
});
