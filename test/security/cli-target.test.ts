// The CLI sends an install's admin token to that install only. It looks for
// the token (`admin-token`) and the server's URL (`address`, written while a
// skiff runs) in the data folders it knows (SKIFF_DATA_DIR, ./.data, the
// checkout's .data). Each taken from the first folder that has one, the
// token of an install that is stopped (its folder has no address) would go
// to another folder's address, or to the default port: another install, or
// any local process, which would then hold full admin rights over the
// first. A token found in a data folder goes only to the address in that
// same folder, unless the URL is written out (--url, SKIFF_URL): SKIFF_PORT,
// which may be set for another install's `npm start`, is not enough.
import { mkdir, mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { resolveTarget, type Target } from "../../services/cli/defaults.js";

let tmp: string;
/** Install A's data folder: its admin token, and its address only when it runs. */
let a: string;
/** The current folder, whose .data is install B's, which runs at B_URL. */
let cwd: string;
const B_URL = "http://127.0.0.1:41234";

beforeEach(async () => {
  tmp = await mkdtemp(path.join(tmpdir(), "skiff-cli-target-"));
  a = path.join(tmp, "a");
  cwd = path.join(tmp, "work");
  await mkdir(a);
  await mkdir(path.join(cwd, ".data"), { recursive: true });
  await writeFile(path.join(a, "admin-token"), "token-of-a\n");
  await writeFile(path.join(cwd, ".data", "address"), `${B_URL}\n`);
  await writeFile(path.join(cwd, ".data", "admin-token"), "token-of-b\n");
});

afterEach(async () => {
  await rm(tmp, { recursive: true, force: true });
});

/** The target, or the error that refused to make one. */
function resolve(env: NodeJS.ProcessEnv, flags: { url?: string; token?: string } = {}): Target | Error {
  try {
    return resolveTarget(flags, env, cwd);
  } catch (err) {
    return err as Error;
  }
}

describe("an install's admin token goes to that install only", () => {
  it("not to another install's address when its own skiff is stopped", () => {
    const target = resolve({ SKIFF_DATA_DIR: a });
    if (target instanceof Error) return expect(target.message).toContain(a);
    expect(target.token === "token-of-a" && target.url === B_URL, JSON.stringify(target)).toBe(false);
  });

  it("not to the default port, where another install or any local process may listen", async () => {
    await rm(path.join(cwd, ".data"), { recursive: true });
    const target = resolve({ SKIFF_DATA_DIR: a });
    if (target instanceof Error) return expect(target.message).toContain(a);
    expect(target.token === "token-of-a" && target.urlSource === "the default", JSON.stringify(target)).toBe(false);
  });

  it("not to a port that SKIFF_PORT names, unless its own skiff runs there", async () => {
    // Stopped: refused, naming the folder.
    const stopped = resolve({ SKIFF_DATA_DIR: a, SKIFF_PORT: "41234" });
    expect(stopped instanceof Error ? stopped.message : JSON.stringify(stopped)).toContain(a);
    // Running elsewhere: refused, naming both.
    await writeFile(path.join(a, "address"), "http://127.0.0.1:45678\n");
    const elsewhere = resolve({ SKIFF_DATA_DIR: a, SKIFF_PORT: "41234" });
    expect(elsewhere instanceof Error ? elsewhere.message : JSON.stringify(elsewhere)).toMatch(
      /http:\/\/127\.0\.0\.1:45678.*http:\/\/127\.0\.0\.1:41234/,
    );
    // Running there: taken.
    expect(resolve({ SKIFF_DATA_DIR: a, SKIFF_PORT: "45678" })).toMatchObject({
      url: "http://127.0.0.1:45678",
      token: "token-of-a",
    });
  });

  it("to its own address while it runs, and where the URL is given", async () => {
    await writeFile(path.join(a, "address"), "http://127.0.0.1:45678\n");
    expect(resolve({ SKIFF_DATA_DIR: a })).toMatchObject({ url: "http://127.0.0.1:45678", token: "token-of-a" });
    await rm(path.join(a, "address"));
    expect(resolve({ SKIFF_DATA_DIR: a, SKIFF_URL: B_URL })).toMatchObject({ url: B_URL, token: "token-of-a" });
    expect(resolve({ SKIFF_DATA_DIR: a }, { url: B_URL })).toMatchObject({ url: B_URL, token: "token-of-a" });
    // A token given explicitly goes where it is told, the address found included.
    expect(resolve({}, { token: "given" })).toMatchObject({ url: B_URL, token: "given" });
    expect(resolve({ SKIFF_TOKEN: "given" })).toMatchObject({ url: B_URL, token: "given" });
  });
});
