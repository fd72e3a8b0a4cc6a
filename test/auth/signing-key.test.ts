// A new signing key is made and exported at once (a first start writes it
// to KV as JWK; its public key is exported for the key id). Node's key
// generation leaves a job object that holds the key's lock until the garbage
// collector frees it, and a collection that frees it during an export of
// the same key deadlocks the process: that hung a test's first start of
// skiff, and a loop of generateKeyPairSync("ed25519") and export({ format:
// "jwk" }) with a young generation of 1 MiB hung within 3 s every time (this
// test, run on that pattern). newEd25519Key gives a key object of its own.
import { spawn } from "node:child_process";
import path from "node:path";
import { expect, it } from "vitest";

const TOKENS = path.resolve(import.meta.dirname, "../../services/auth/tokens.ts");

it("keys made and exported at once, under constant garbage collection, never hang the process", async () => {
  const script = `
    import { createPublicKey } from "node:crypto";
    const { newEd25519Key, signingKeyFrom } = await import(${JSON.stringify(TOKENS)});
    const until = Date.now() + 3000;
    let junk = [], n = 0;
    while (Date.now() < until) {
      const key = newEd25519Key();
      key.export({ format: "jwk" });
      createPublicKey(key).export({ format: "jwk" });
      if (n % 50 === 0) await signingKeyFrom(key);
      for (let i = 0; i < 50; i++) junk.push({ i, s: "x" + i });
      if (junk.length > 5000) junk = [];
      n++;
    }
    console.log(n);
  `;
  const child = spawn(
    process.execPath,
    ["--max-semi-space-size=1", "--import", "tsx", "--input-type=module", "-e", script],
    {
      stdio: ["ignore", "pipe", "inherit"],
    },
  );
  let out = "";
  child.stdout.on("data", (d: Buffer) => (out += d.toString()));
  const code = await new Promise<number | string>((resolve) => {
    const timer = setTimeout(() => {
      child.kill("SIGKILL");
      resolve("hung");
    }, 30_000);
    child.on("exit", (c) => {
      clearTimeout(timer);
      resolve(c ?? "killed");
    });
  });
  expect(code).toBe(0);
  expect(Number(out.trim())).toBeGreaterThan(100);
}, 40_000);
