// Bundles that try to climb out of the app folder through links, or to make
// skiff write through one, and the limits on entries.
import { lstat, mkdtemp, readdir, readFile, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { gunzipSync, gzipSync } from "node:zlib";
import { Header, Pax } from "tar";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { BundleError, unpackBundle } from "../../services/apps/bundle.js";
import { silentLogger } from "../../services/config/logger.js";
import { DeploymentCache } from "../../services/runner/deployment-cache.js";
import { sha256 } from "../../services/apps/bundle.js";
import { skiffToml } from "../helpers/apps.js";
import { rawTar, type RawEntry } from "../helpers/raw-tar.js";

const TOML = skiffToml({ name: "links", runtime: { kind: "custom", command: ["node", "server.mjs"] } });

/** A bundle of these entries after a valid skiff.toml. */
const tarOf = (entries: RawEntry[]): Buffer => rawTar([{ path: "skiff.toml", body: TOML }, ...entries]);

let tmp: string;
beforeAll(async () => {
  tmp = await mkdtemp(path.join(tmpdir(), "skiff-links-"));
});
afterAll(() => rm(tmp, { recursive: true, force: true }));

async function refused(entries: RawEntry[], opts: { maxFiles?: number } = {}): Promise<string> {
  const dest = await mkdtemp(path.join(tmp, "dest-"));
  const err = await unpackBundle(tarOf(entries), dest, { maxBytes: 1024 * 1024, ...opts }).then(
    () => undefined,
    (e: unknown) => e,
  );
  expect(err).toBeInstanceOf(BundleError);
  expect((err as BundleError).reason).toBe("invalid");
  expect(await readdir(dest)).toEqual([]);
  return (err as Error).message;
}

const deep = (n: number) => Array.from({ length: n }, (_, i) => `a${i + 1}`).join("/");

describe("bundle - links that would climb out", () => {
  it("a link through a link to '.': d/d/d/../../.. reads as inside but lands outside", async () => {
    expect(
      await refused([
        { path: "d", type: "SymbolicLink", linkpath: "." },
        { path: "e", type: "SymbolicLink", linkpath: "d/d/d/../../../etc" },
      ]),
    ).toMatch(/passes through another link|leaves the app folder/);
  });

  it("the a1/…/a10/s/.. chain: ten steps down through a link to '.', ten up: text says inside, the kernel says /", async () => {
    const down = Array.from({ length: 10 }, () => "a1").join("/");
    const up = Array.from({ length: 10 }, () => "..").join("/");
    expect(
      await refused([
        { path: "a1", type: "SymbolicLink", linkpath: "." },
        { path: "root", type: "SymbolicLink", linkpath: `${down}/${up}/etc` },
      ]),
    ).toMatch(/passes through another link/);
    // A plain climb is refused by its text already.
    expect(await refused([{ path: "up", type: "SymbolicLink", linkpath: `${deep(2)}/${"../".repeat(3)}` }])).toMatch(
      /outside the app folder|leaves the app folder/,
    );
  });

  it("the order in the tar does not matter: a link defined after the one that passes through it", async () => {
    expect(
      await refused([
        { path: "e", type: "SymbolicLink", linkpath: "d/d/../.." },
        { path: "d", type: "SymbolicLink", linkpath: "." },
      ]),
    ).toMatch(/passes through another link/);
  });

  it("a hard link whose target passes through a symbolic link", async () => {
    expect(
      await refused([
        { path: "d", type: "SymbolicLink", linkpath: "." },
        { path: "h", type: "Link", linkpath: "d/d/../../etc/passwd" },
      ]),
    ).toMatch(/passes through another link|leaves the app folder/);
  });

  it("a dangling link, which the file system cannot resolve inside the folder", async () => {
    expect(await refused([{ path: "nowhere", type: "SymbolicLink", linkpath: "no-such-file" }])).toMatch(
      /does not resolve to a file or folder of the app/,
    );
  });

  it(".skiff/ is skiff's: a bundle cannot place prepared.json or a link there", async () => {
    expect(await refused([{ path: ".skiff/prepared.json", body: '{"python":"../../../bin/sh"}' }])).toMatch(/\.skiff/);
    expect(await refused([{ path: ".skiff", type: "SymbolicLink", linkpath: "." }])).toMatch(/\.skiff/);
  });

  it("more entries than SKIFF_MAX_BUNDLE_FILES", async () => {
    const many = Array.from({ length: 20 }, (_, i) => ({ path: `f${i}.txt`, body: "x" }));
    expect(await refused(many, { maxFiles: 10 })).toMatch(/more than 10 entries.*SKIFF_MAX_BUNDLE_FILES/);
  });

  it("links that stay inside, through real folders only, are kept", async () => {
    const dest = await mkdtemp(path.join(tmp, "ok-"));
    await unpackBundle(
      tarOf([
        { path: "lib/util.mjs", body: "export const x = 1;\n" },
        { path: "current", type: "SymbolicLink", linkpath: "lib" },
        { path: "lib/again.mjs", type: "SymbolicLink", linkpath: "../lib/util.mjs" },
      ]),
      dest,
      { maxBytes: 1024 * 1024 },
    );
    expect((await lstat(path.join(dest, "current"))).isSymbolicLink()).toBe(true);
    expect(await readFile(path.join(dest, "current", "util.mjs"), "utf8")).toContain("x = 1");
  });
});

describe("deployment cache - prepared.json is never written through a link", () => {
  it("a prepared deployment has a real .skiff folder and its marker; the bundle could not provide either", async () => {
    const root = await mkdtemp(path.join(tmp, "cache-"));
    const cache = new DeploymentCache(root, { maxBytes: 1024 * 1024, logger: silentLogger });
    const bytes = tarOf([{ path: "server.mjs", body: "" }]);
    const ready = await cache.get(sha256(bytes), async () => bytes);
    expect((await lstat(path.join(ready.dir, ".skiff"))).isDirectory()).toBe(true);
    expect((await lstat(path.join(ready.dir, ".skiff", "prepared.json"))).isFile()).toBe(true);
    // A bundle that brings its own .skiff is refused before anything is written.
    const evil = tarOf([{ path: ".skiff", type: "SymbolicLink", linkpath: "/tmp" }]);
    await expect(cache.get(sha256(evil), async () => evil)).rejects.toBeInstanceOf(BundleError);
    await writeFile(path.join(tmp, "untouched"), "");
    expect((await readdir(root)).filter((n) => n.startsWith(".staging"))).toEqual([]);
  });

  it("a prepared folder no app lists any more is pruned at once by the process that made it", async () => {
    const root = await mkdtemp(path.join(tmp, "prune-"));
    const cache = new DeploymentCache(root, { maxBytes: 1024 * 1024, logger: silentLogger });
    const bytes = tarOf([{ path: "server.mjs", body: "// prune me" }]);
    const digest = sha256(bytes);
    await cache.get(digest, async () => bytes);
    expect(await cache.prune(new Set([digest]))).toEqual([]);
    expect(await cache.prune(new Set())).toEqual([digest]);
    expect(await readdir(root)).toEqual([]);
  });
});

describe("bundle - paths that are a file and something else (found by fuzzing)", () => {
  it("a hard link to a folder, or to anything that is not a file earlier in the bundle, is refused", async () => {
    for (const linkpath of [".", "sub", "later.txt", "no-such-file"]) {
      expect(
        await refused([
          { path: "sub", type: "Directory" },
          { path: "h", type: "Link", linkpath },
          { path: "later.txt", body: "x" },
        ]),
      ).toMatch(/is a hard link to .*, which is not a file earlier in the bundle/);
    }
  });

  it("a hard link to a file earlier in the bundle is unpacked", async () => {
    const dest = await mkdtemp(path.join(tmp, "dest-"));
    await unpackBundle(
      tarOf([
        { path: "a.txt", body: "same" },
        { path: "./b.txt", type: "Link", linkpath: "./a.txt" },
      ]),
      dest,
      { maxBytes: 1024 * 1024 },
    );
    expect(await readFile(path.join(dest, "b.txt"), "utf8")).toBe("same");
    expect((await lstat(path.join(dest, "b.txt"))).nlink).toBe(2);
  });

  it("an entry below a file (skiff.toml/a linked to skiff.toml) is refused rather than left waiting forever", async () => {
    expect(await refused([{ path: "skiff.toml/a", type: "Link", linkpath: "skiff.toml" }])).toMatch(
      /"skiff\.toml\/a" lies below a file/,
    );
  });

  it("skiff.toml at the root must be a file, not a folder or a symbolic link", async () => {
    const dest = await mkdtemp(path.join(tmp, "dest-"));
    for (const entries of [
      [{ path: "skiff.toml", type: "Directory" as const }],
      [
        { path: "real.toml", body: TOML },
        { path: "skiff.toml", type: "SymbolicLink" as const, linkpath: "real.toml" },
      ],
    ]) {
      await expect(unpackBundle(rawTar(entries), dest, { maxBytes: 1024 * 1024 })).rejects.toThrow(
        /^skiff\.toml at the root of the bundle is a (Directory|SymbolicLink), not a file$/,
      );
    }
    expect(await readdir(dest)).toEqual([]);
  });

  it("an entry the file system refuses (a name too long) fails the unpacking only once the unpacker has stopped writing", async () => {
    const dest = await mkdtemp(path.join(tmp, "dest-"));
    // A pax header names the next entry d/nnn…n, one segment longer than any file system takes.
    const pax = new Pax({ path: `d/${"n".repeat(300)}` }).encode();
    const head = Buffer.alloc(512);
    new Header({ path: "d/short", type: "File", size: 1, mode: 0o644, mtime: new Date(0), uid: 0, gid: 0 }).encode(
      head,
      0,
    );
    const body = Buffer.alloc(512, 0);
    body.write("x");
    const base = gunzipSync(tarOf([{ path: "z/after.txt", body: "y" }]));
    const tar = Buffer.concat([base.subarray(0, 1024), pax, head, body, base.subarray(1024)]);
    await expect(unpackBundle(gzipSync(tar), dest, { maxBytes: 1024 * 1024 })).rejects.toThrow(
      /^cannot unpack the bundle: ENAMETOOLONG/,
    );
    // The entry after the refused one was written before the refusal came back, not after.
    expect(await readFile(path.join(dest, "z", "after.txt"), "utf8")).toBe("y");
  });
});

describe("bundle - links the unpacker would wait on forever (found by fuzzing)", () => {
  it.each([
    ["a/a -> a", { path: "a/a", type: "SymbolicLink" as const, linkpath: "a" }],
    ["x/y/z -> X/Y (folded case)", { path: "x/y/z", type: "SymbolicLink" as const, linkpath: "X/Y" }],
    ["d -> d/e", { path: "d", type: "SymbolicLink" as const, linkpath: "d/e" }],
  ])("%s is refused", async (_name, entry) => {
    expect(await refused([entry])).toMatch(/is a link whose path and target lie one inside the other/);
  });
});
