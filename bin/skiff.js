#!/usr/bin/env node
// The `skiff` command. It runs the TypeScript CLI bundled into one file
// (node_modules/.cache/skiff/cli.mjs, made with esbuild on first use and
// again whenever one of the files bundled into it changes, as the list beside
// it records), which starts in a fraction of the time that compiling every
// module on each start takes. Where that folder cannot be written, the
// sources run through tsx as they are.
import { mkdirSync, readFileSync, renameSync, statSync, writeFileSync } from "node:fs";
import path from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";

const root = fileURLToPath(new URL("..", import.meta.url));
const entry = path.join(root, "services", "cli", "main.ts");
const cache = path.join(root, "node_modules", ".cache", "skiff");
const bundle = path.join(cache, "cli.mjs");
const inputs = path.join(cache, "cli.inputs.json");

const stamp = (file) => {
  const s = statSync(path.join(root, file));
  return `${s.mtimeMs}:${s.size}`;
};

/** Whether the bundle holds the files as they are now: each input's modification time and size as recorded. */
function fresh() {
  try {
    statSync(bundle);
    const recorded = JSON.parse(readFileSync(inputs, "utf8"));
    return Object.entries(recorded).every(([file, was]) => stamp(file) === was);
  } catch {
    return false; // no bundle, no record, or a file gone: make it again
  }
}

async function build() {
  const { build } = await import("esbuild");
  const result = await build({
    absWorkingDir: root,
    entryPoints: [entry],
    bundle: true,
    platform: "node",
    format: "esm",
    target: "node20",
    packages: "external",
    tsconfig: path.join(root, "tsconfig.json"),
    // The CLI finds the checkout from its own place (services/cli/defaults.ts): the sources', not the bundle's.
    define: { "import.meta.url": JSON.stringify(pathToFileURL(entry).href) },
    metafile: true,
    write: false,
    logLevel: "silent",
  });
  const recorded = Object.fromEntries(Object.keys(result.metafile.inputs).map((file) => [file, stamp(file)]));
  mkdirSync(cache, { recursive: true });
  // Each process writes files of its own and renames them into place: starts at the same time do not mix.
  const own = `.${process.pid}`;
  writeFileSync(bundle + own, result.outputFiles[0].contents);
  renameSync(bundle + own, bundle);
  writeFileSync(inputs + own, JSON.stringify(recorded));
  renameSync(inputs + own, inputs);
}

let bundled = fresh();
if (!bundled) {
  try {
    await build();
    bundled = true;
  } catch {
    bundled = false; // a read-only install, say: the sources through tsx
  }
}
if (bundled) {
  await import(pathToFileURL(bundle).href);
} else {
  const { register } = await import("tsx/esm/api");
  register({ tsconfig: path.join(root, "tsconfig.json") });
  await import(pathToFileURL(entry).href);
}
