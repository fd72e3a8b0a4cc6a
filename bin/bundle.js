// Runs a TypeScript entry of services/ from one bundled file in
// node_modules/.cache/skiff/, made with esbuild on first use and again whenever
// one of the files bundled into it changes (the list beside it records each
// file's modification time and size). A bundle starts in a fraction of the time
// that compiling every module on each start takes, and carries none of the
// per-function bookkeeping of an on-the-fly compiler. Where that folder cannot
// be written, the sources run through tsx as they are.
import { mkdirSync, readFileSync, renameSync, statSync, writeFileSync } from "node:fs";
import { readFile } from "node:fs/promises";
import path from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";

const root = fileURLToPath(new URL("..", import.meta.url));
const cache = path.join(root, "node_modules", ".cache", "skiff");

const stamp = (file) => {
  const s = statSync(path.join(root, file));
  return `${s.mtimeMs}:${s.size}`;
};

/**
 * Each source file keeps its own `import.meta.url` and `import.meta.dirname` in the bundle: files beside a
 * module (the sandbox's shims, the seccomp script, the dashboard's build) are found from the module's place
 * in services/, not the bundle's.
 */
const ownImportMeta = {
  name: "own-import-meta",
  setup(build) {
    build.onLoad({ filter: /\.ts$/ }, async (args) => {
      if (args.path.includes(`${path.sep}node_modules${path.sep}`)) return undefined;
      const source = await readFile(args.path, "utf8");
      if (!source.includes("import.meta")) return { contents: source, loader: "ts" };
      const contents = source
        .replaceAll("import.meta.url", JSON.stringify(pathToFileURL(args.path).href))
        .replaceAll("import.meta.dirname", JSON.stringify(path.dirname(args.path)))
        .replaceAll("import.meta.filename", JSON.stringify(args.path));
      return { contents, loader: "ts" };
    });
  },
};

/**
 * Whether `bundle` holds the files as they are now: made in this checkout (the bundle names its sources by
 * their absolute places, and a copy of the checkout keeps every file's time and size), each input's
 * modification time and size as recorded.
 */
function fresh(bundle, inputs) {
  try {
    statSync(bundle);
    const recorded = JSON.parse(readFileSync(inputs, "utf8"));
    if (recorded.root !== root) return false;
    return Object.entries(recorded.files).every(([file, was]) => stamp(file) === was);
  } catch {
    return false; // no bundle, no record (or one of an earlier form), or a file gone: make it again
  }
}

async function build(entry, bundle, inputs) {
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
    plugins: [ownImportMeta],
    metafile: true,
    write: false,
    logLevel: "silent",
  });
  const files = Object.fromEntries(Object.keys(result.metafile.inputs).map((file) => [file, stamp(file)]));
  const recorded = { root, files };
  mkdirSync(cache, { recursive: true });
  // Each process writes files of its own and renames them into place: starts at the same time do not mix.
  const own = `.${process.pid}`;
  writeFileSync(bundle + own, result.outputFiles[0].contents);
  renameSync(bundle + own, bundle);
  writeFileSync(inputs + own, JSON.stringify(recorded));
  renameSync(inputs + own, inputs);
}

/**
 * The bundle of `source` (a path under the checkout), made or made again first; undefined where it cannot be
 * written (a read-only install, say).
 */
export async function bundleOf(source, name) {
  const bundle = path.join(cache, `${name}.mjs`);
  const inputs = path.join(cache, `${name}.inputs.json`);
  if (fresh(bundle, inputs)) return bundle;
  try {
    await build(path.join(root, source), bundle, inputs);
    return bundle;
  } catch {
    return undefined;
  }
}

/** Runs `source` from its bundle `<name>.mjs`, or through tsx as it is where no bundle can be made. */
export async function runBundled(source, name) {
  const bundle = await bundleOf(source, name);
  if (bundle !== undefined) {
    await import(pathToFileURL(bundle).href);
  } else {
    const { register } = await import("tsx/esm/api");
    register({ tsconfig: path.join(root, "tsconfig.json") });
    await import(pathToFileURL(path.join(root, source)).href);
  }
}

/** Makes (or makes again) the server's and the CLI's bundles; the entries it could not bundle. */
export async function bundleAll() {
  const failed = [];
  for (const [source, name] of [
    ["services/main.ts", "server"],
    ["services/cli/main.ts", "cli"],
  ])
    if ((await bundleOf(source, name)) === undefined) failed.push(source);
  return failed;
}

// `node bin/bundle.js` (`npm run build`): makes both bundles now, for an install whose node_modules is read-only later.
if (process.argv[1] !== undefined && pathToFileURL(process.argv[1]).href === import.meta.url) {
  const failed = await bundleAll();
  if (failed.length > 0) {
    console.error(`could not bundle ${failed.join(", ")} into ${cache}`);
    process.exit(1);
  }
}
