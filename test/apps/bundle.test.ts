// Bundle rules: what packApp takes from a folder, and what unpackBundle
// refuses before writing anything.
import { randomBytes } from "node:crypto";
import { mkdtemp, readdir, readFile, rm, symlink } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { gzipSync } from "node:zlib";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { BundleError, packApp, sha256, unpackBundle } from "../../services/apps/bundle.js";
import { writeApp } from "../helpers/apps.js";
import { rawTar, TOML, type RawEntry } from "../helpers/raw-tar.js";

let tmp: string;
beforeAll(async () => {
  tmp = await mkdtemp(path.join(tmpdir(), "skiff-bundle-"));
});
afterAll(() => rm(tmp, { recursive: true, force: true }));

async function refusal(bytes: Buffer, maxBytes = 1024 * 1024): Promise<BundleError> {
  const dest = await mkdtemp(path.join(tmp, "dest-"));
  const err = await unpackBundle(bytes, dest, { maxBytes }).then(
    () => undefined,
    (e: unknown) => e,
  );
  expect(err).toBeInstanceOf(BundleError);
  // Nothing was written: the whole bundle is checked first.
  expect(await readdir(dest)).toEqual([]);
  return err as BundleError;
}

describe("bundle - pack", () => {
  it("honours .gitignore and .skiffignore, always leaves out .git, node_modules and .skiff", async () => {
    const dir = await writeApp(tmp, {
      "skiff.toml": TOML,
      "server.mjs": "",
      ".gitignore": "*.log\nbuild/\n",
      ".skiffignore": "secret.txt\n",
      "app.log": "",
      "build/out.js": "",
      "secret.txt": "",
      "src/keep.js": "",
      "src/node_modules/x.js": "",
      ".git/HEAD": "",
      "node_modules/dep/index.js": "",
      ".skiff/venv/bin/python": "",
    });
    const packed = await packApp(dir);
    expect(packed.files).toEqual([
      ".gitignore",
      ".skiffignore",
      "server.mjs",
      "skiff.toml",
      "src/keep.js",
      "src/node_modules/x.js",
    ]);
    const dest = path.join(tmp, "round-trip");
    const info = await unpackBundle(packed.bytes, dest, { maxBytes: 1024 * 1024 });
    expect(info.entries.sort()).toEqual(packed.files);
    expect(await readFile(path.join(dest, "skiff.toml"), "utf8")).toBe(TOML);
  });

  it("is reproducible: the same folder gives the same digest", async () => {
    const dir = await writeApp(tmp, { "skiff.toml": TOML, "a.txt": "a" });
    expect(sha256((await packApp(dir)).bytes)).toBe(sha256((await packApp(dir)).bytes));
  });

  it("keeps a link inside the folder, refuses one that points out, needs skiff.toml", async () => {
    const inside = await writeApp(tmp, { "skiff.toml": TOML, "data/a.txt": "a" });
    await symlink("data/a.txt", path.join(inside, "link.txt"));
    expect((await packApp(inside)).files).toContain("link.txt");
    const outside = await writeApp(tmp, { "skiff.toml": TOML });
    await symlink("../../etc/passwd", path.join(outside, "passwd"));
    await expect(packApp(outside)).rejects.toThrow(
      /passwd is a link to \.\.\/\.\.\/etc\/passwd, outside the app folder/,
    );
    await expect(packApp(await writeApp(tmp, { "main.py": "" }))).rejects.toThrow(/skiff\.toml not found/);
  });
});

describe("bundle - unpack refuses", () => {
  const toml: RawEntry = { path: "skiff.toml", body: TOML };
  it.each<[string, RawEntry[], RegExp]>([
    ["an absolute path", [toml, { path: "/etc/cron.d/x", body: "x" }], /"\/etc\/cron\.d\/x" is an absolute path/],
    ["a .. segment", [toml, { path: "a/../../x", body: "x" }], /"a\/\.\.\/\.\.\/x" has a "\.\." segment/],
    [
      "a symlink out of the folder",
      [toml, { path: "sub/l", type: "SymbolicLink", linkpath: "../../outside" }],
      /"sub\/l" is a link to "\.\.\/\.\.\/outside", outside the app folder/,
    ],
    [
      "an absolute symlink",
      [toml, { path: "l", type: "SymbolicLink", linkpath: "/etc/passwd" }],
      /is a link to "\/etc\/passwd", outside/,
    ],
    [
      "a hard link out of the folder",
      [toml, { path: "h", type: "Link", linkpath: "../x" }],
      /"h" is a link to "\.\.\/x", outside/,
    ],
    [
      "an entry below a link",
      [toml, { path: "d", type: "SymbolicLink", linkpath: "." }, { path: "d/x", body: "x" }],
      /"d\/x" lies below a link/,
    ],
    [
      "a device file",
      [toml, { path: "dev", type: "CharacterDevice" }],
      /"dev" is a CharacterDevice; only files, folders and links/,
    ],
    ["a FIFO", [toml, { path: "fifo", type: "FIFO" }], /"fifo" is a FIFO/],
    [
      "no skiff.toml at the root",
      [{ path: "app/skiff.toml", body: TOML }],
      /no skiff\.toml \(or cerebrium\.toml\) at its root/,
    ],
  ])("%s", async (_name, entries, message) => {
    expect((await refusal(rawTar(entries))).message).toMatch(message);
  });

  it("a bundle over the limit, compressed or unpacked", async () => {
    const big = await refusal(rawTar([toml, { path: "r", body: randomBytes(4096) }]), 2048);
    expect(big).toMatchObject({
      reason: "too_large",
      message: expect.stringMatching(/is \d+ bytes, more than the limit of 2048 bytes \(SKIFF_MAX_BUNDLE_BYTES\)/),
    });
    const bomb = await refusal(rawTar([toml, { path: "zeros", body: Buffer.alloc(64 * 1024) }]), 8192);
    expect(bomb).toMatchObject({
      reason: "too_large",
      message: expect.stringMatching(/unpacks to more than the limit of 8192 bytes/),
    });
  });

  it("something that is not a gzipped tar", async () => {
    expect((await refusal(Buffer.from("hello"))).message).toMatch(/not gzip-compressed/);
    expect((await refusal(gzipSync(Buffer.from("x".repeat(600))))).message).toMatch(/not a valid tar|no skiff\.toml/);
  });

  it("accepts a link that stays inside", async () => {
    const dest = path.join(tmp, "inside-link");
    await unpackBundle(
      rawTar([toml, { path: "a/b.txt", body: "b" }, { path: "a/c", type: "SymbolicLink", linkpath: "b.txt" }]),
      dest,
      { maxBytes: 1 << 20 },
    );
    expect(await readFile(path.join(dest, "a", "c"), "utf8")).toBe("b");
  });
});
