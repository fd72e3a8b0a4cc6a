// Fuzzing bundle unpacking (apps/bundle.ts): arbitrary bytes, gzip of
// arbitrary bytes, and tars of crafted entries (names with "..", absolute
// paths, links of both kinds to anywhere, devices, sizes that lie, long
// names, more entries than allowed). unpackBundle either refuses with a
// BundleError or writes files strictly inside its folder; after every case
// the temporary parent folder holds nothing else, the file beside the
// target is untouched and has no new hard link.
import assert from "node:assert/strict";
import { lstat, mkdir, mkdtemp, readdir, readFile, realpath, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { gzipSync } from "node:zlib";
import fc from "fast-check";
import { Header, Pax, type HeaderData } from "tar";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { BundleError, unpackBundle } from "../../services/apps/bundle.js";
import { FUZZ_RUNS, fuzzTimeout } from "./runs.js";

const MAX_BYTES = 64 * 1024;
const MAX_FILES = 8;
const TOML = '[app]\nname = "fuzz"\n\n[runtime]\nkind = "custom"\ncommand = ["node", "server.mjs"]\n';

interface Entry {
  path: string;
  type: HeaderData["type"];
  linkpath?: string;
  body: Buffer;
  /** The size the header claims, when it lies about the body. */
  size?: number;
}

/** A tar of these entries, written block by block (no packer's checks), optionally cut short. */
function tarOf(entries: Entry[], cut?: number): Buffer {
  const blocks: Buffer[] = [];
  for (const e of entries) {
    const block = Buffer.alloc(512);
    const fields = {
      path: e.path,
      type: e.type,
      linkpath: e.linkpath,
      size: e.size ?? e.body.length,
      mode: e.type === "Directory" ? 0o755 : 0o644,
      mtime: new Date(0),
      uid: 0,
      gid: 0,
    };
    // A path, link or size too long for the header goes in a pax header before it.
    if (new Header(fields).encode(block, 0)) blocks.push(new Pax(fields).encode());
    blocks.push(block, e.body, Buffer.alloc((512 - (e.body.length % 512)) % 512));
  }
  blocks.push(Buffer.alloc(1024));
  const tar = Buffer.concat(blocks);
  return cut === undefined ? tar : tar.subarray(0, cut % (tar.length + 1));
}

let parent: string;
/** Three levels below the parent, so that "..", "../.." and "../../.." all land inside it. */
let dest: string;
let sentinel: string;
let outsideTarget: string;

const segment = fc.oneof(
  { weight: 6, arbitrary: fc.constantFrom("a", "b", "d", "src", "x.txt", "skiff.toml", "server.mjs") },
  { weight: 2, arbitrary: fc.constantFrom("..", ".", "", ".skiff", "...", "a\\..", "C:", "~") },
  { weight: 1, arbitrary: fc.string({ maxLength: 12 }) },
  { weight: 1, arbitrary: fc.string({ unit: "grapheme", maxLength: 6 }) },
  { weight: 1, arbitrary: fc.nat({ max: 300 }).map((n) => "n".repeat(n)) },
);
const entryPath = fc.oneof(
  { weight: 8, arbitrary: fc.array(segment, { minLength: 1, maxLength: 4 }).map((s) => s.join("/")) },
  {
    weight: 2,
    arbitrary: fc
      .tuple(
        fc.constantFrom("/", "\\", "./", "//", "C:/", "c:\\", "../", "../../../"),
        fc.array(segment, { maxLength: 3 }),
      )
      .map(([p, s]) => p + s.join("/")),
  },
);
/** Link targets: inside, climbing out, absolute (the file beside the target included), through other links. */
const linkTarget = () =>
  fc.oneof(
    fc.constantFrom(
      ".",
      "..",
      "../..",
      "../../..",
      "a",
      "d",
      "d/d/../..",
      "skiff.toml",
      "/etc/passwd",
      "",
      "a/../../x",
    ),
    fc.constant(outsideTarget),
    fc.constant(path.relative(dest, outsideTarget)),
    entryPath,
  );
const type = fc.oneof(
  { weight: 8, arbitrary: fc.constant<HeaderData["type"]>("File") },
  { weight: 3, arbitrary: fc.constantFrom<HeaderData["type"]>("Directory", "SymbolicLink", "Link") },
  {
    weight: 1,
    arbitrary: fc.constantFrom<HeaderData["type"]>(
      "OldFile",
      "ContiguousFile",
      "CharacterDevice",
      "BlockDevice",
      "FIFO",
      "GNUDumpDir",
    ),
  },
);
const entry = () =>
  fc
    .record({
      path: entryPath,
      type,
      linkpath: linkTarget(),
      body: fc.oneof(
        { weight: 6, arbitrary: fc.string({ maxLength: 40 }).map((s) => Buffer.from(s)) },
        { weight: 1, arbitrary: fc.uint8Array({ maxLength: 700 }).map((b) => Buffer.from(b)) },
      ),
      size: fc.oneof(
        { weight: 10, arbitrary: fc.constant(undefined) },
        { weight: 1, arbitrary: fc.constantFrom(0, 1, 511, 513, 2 ** 33, 2 ** 40, Number.MAX_SAFE_INTEGER) },
      ),
    })
    .map((e): Entry => ({
      path: e.path,
      type: e.type,
      body: e.type === "File" || e.type === "OldFile" || e.type === "ContiguousFile" ? e.body : Buffer.alloc(0),
      ...(e.type === "SymbolicLink" || e.type === "Link" ? { linkpath: e.linkpath } : {}),
      ...(e.size !== undefined ? { size: e.size } : {}),
    }));
const crafted = () =>
  fc
    .tuple(
      fc.boolean(),
      fc.array(entry(), { maxLength: MAX_FILES + 2, size: "small" }),
      fc.option(fc.nat(), { freq: 8, nil: undefined }),
    )
    .map(([withToml, entries, cut]) =>
      gzipSync(
        tarOf(withToml ? [{ path: "skiff.toml", type: "File", body: Buffer.from(TOML) }, ...entries] : entries, cut),
        { level: 1 },
      ),
    );
const bytes = () =>
  fc.oneof(
    { weight: 1, arbitrary: fc.uint8Array({ maxLength: 200 }) },
    {
      weight: 1,
      arbitrary: fc.uint8Array({ maxLength: 200 }).map((b) => Buffer.concat([Buffer.from([0x1f, 0x8b]), b])),
    },
    { weight: 1, arbitrary: fc.uint8Array({ maxLength: 2048 }).map((b) => gzipSync(b)) },
    // More than the limit once unpacked, or more than it as sent.
    { weight: 1, arbitrary: fc.constantFrom(...OVERSIZED) },
    { weight: 12, arbitrary: crafted() },
  );

/** More than the limit once unpacked (a little, and much), and more than it as sent. */
const OVERSIZED = [
  gzipSync(Buffer.alloc(MAX_BYTES + 1)),
  gzipSync(Buffer.alloc(16 * MAX_BYTES)),
  Buffer.alloc(MAX_BYTES + 1, 0x1f),
];

/** Every path under `dir`, relative, with its lstat. */
async function walk(dir: string, rel = ""): Promise<string[]> {
  const out: string[] = [];
  for (const e of await readdir(path.join(dir, rel), { withFileTypes: true })) {
    const p = rel === "" ? e.name : `${rel}/${e.name}`;
    out.push(p);
    if (e.isDirectory()) out.push(...(await walk(dir, p)));
  }
  return out;
}

describe("fuzz: bundle unpacking", () => {
  beforeAll(async () => {
    parent = await mkdtemp(path.join(tmpdir(), "skiff-fuzz-bundle-"));
    dest = path.join(parent, "a", "b", "c", "app");
    sentinel = path.join(parent, "a", "b", "c", "beside.txt");
    outsideTarget = sentinel;
    await mkdir(path.dirname(dest), { recursive: true });
    await writeFile(sentinel, "untouched");
  });
  afterAll(() => rm(parent, { recursive: true, force: true }));

  it(
    `arbitrary and crafted bundles: a BundleError, or files strictly inside the folder (${FUZZ_RUNS} cases)`,
    async () => {
      let unpacked = 0;
      const destReal = () => realpath(dest);
      await fc.assert(
        fc.asyncProperty(bytes(), async (bundle) => {
          let ok = false;
          try {
            await unpackBundle(bundle, dest, { maxBytes: MAX_BYTES, maxFiles: MAX_FILES });
            ok = true;
          } catch (err) {
            assert.ok(err instanceof BundleError, `not a BundleError: ${String(err)}`);
            assert.ok(err.reason === "invalid" || err.reason === "too_large");
            assert.ok(err.message.length > 0);
          }
          // Nothing beside the target but the file that was there, unchanged and not linked to: each
          // folder above the target holds what it held (anything written above would show in one of them).
          assert.deepEqual(await readdir(parent), ["a"]);
          assert.deepEqual(await readdir(path.join(parent, "a")), ["b"]);
          assert.deepEqual(await readdir(path.join(parent, "a", "b")), ["c"]);
          const beside = await readdir(path.dirname(dest));
          assert.ok(
            beside.includes("beside.txt") && beside.every((n) => n === "beside.txt" || n === "app"),
            `written outside the folder: ${beside.join(", ")}`,
          );
          assert.equal(await readFile(sentinel, "utf8"), "untouched");
          assert.equal((await lstat(sentinel)).nlink, 1, "a hard link to the file beside the folder");
          if (ok) {
            unpacked++;
            assert.ok((await lstat(path.join(dest, "skiff.toml"))).isFile());
            // Every link written resolves inside the folder.
            const root = await destReal();
            for (const p of await walk(dest)) {
              const full = path.join(dest, p);
              const st = await lstat(full);
              assert.ok(
                st.isFile() || st.isDirectory() || st.isSymbolicLink(),
                `${p} is neither file, folder nor link`,
              );
              if (st.isSymbolicLink()) {
                const real = await realpath(full);
                assert.ok(real === root || real.startsWith(root + path.sep), `${p} resolves to ${real}`);
              }
            }
          }
          if (beside.includes("app")) await rm(dest, { recursive: true, force: true });
        }),
        { numRuns: FUZZ_RUNS, timeout: 10_000 },
      );
      console.log(`bundles: ${unpacked} of ${FUZZ_RUNS} unpacked`);
      // Enough bundles pass every check for "files strictly inside" to be tested.
      expect(unpacked).toBeGreaterThan(FUZZ_RUNS / 100);
    },
    fuzzTimeout(40),
  );
});
