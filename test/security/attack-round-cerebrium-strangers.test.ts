// A refused cerebrium.toml now lists the keys and tables skiff did not know,
// each with the known name it is closest to ("did you mean"). Attacked as a
// tenant with a project token who deploys bundles through the API: names
// made to cost CPU in the edit distance, and names made to come back in the
// refusal (the answer of every protocol, the CLI's terminal) longer or odder
// than a warning may. Real skiff, real NATS, deploys over REST, Connect and gRPC.
import { mkdir, mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { Code, ConnectError, createClient } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import { c as createTar } from "tar";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { ManagementService } from "../../gen/skiff/management/v2/management_pb.js";
import { AppConfigError } from "../../services/apps/app-config.js";
import { parseCerebriumConfig } from "../../services/apps/cerebrium-config.js";
import { bearer, startTestSkiff, type TestSkiff } from "../helpers/skiff.js";

const P = "p-dev";

let t: TestSkiff;
let tmp: string;

/** A gzipped tar of a folder holding `files`. */
async function bundle(name: string, files: Record<string, string>): Promise<Buffer> {
  const dir = path.join(tmp, name);
  for (const [rel, body] of Object.entries(files)) {
    await mkdir(path.dirname(path.join(dir, rel)), { recursive: true });
    await writeFile(path.join(dir, rel), body);
  }
  const chunks: Buffer[] = [];
  for await (const chunk of createTar({ gzip: true, cwd: dir, portable: true }, Object.keys(files)))
    chunks.push(Buffer.from(chunk as Uint8Array));
  return Buffer.concat(chunks);
}

async function deployRest(bytes: Buffer): Promise<{ status: number; message: string }> {
  const res = await fetch(`${t.url}/v2/projects/${P}/apps`, {
    method: "POST",
    headers: { authorization: `Bearer ${t.devToken}`, "content-type": "application/gzip" },
    body: bytes,
  });
  const text = await res.text();
  let message = text;
  try {
    message = String((JSON.parse(text) as { message?: string }).message ?? text);
  } catch {
    // not JSON: the text itself
  }
  return { status: res.status, message };
}

/** A cerebrium.toml whose [cerebrium.deployment] lacks its name (so it is refused) and holds `keys`. */
const refusedToml = (keys: string[]) => `[cerebrium.deployment]\n${keys.join("\n")}\n`;

beforeAll(async () => {
  tmp = await mkdtemp(path.join(tmpdir(), "skiff-attack-strangers-"));
  t = await startTestSkiff();
}, 120_000);
afterAll(async () => {
  await t?.close();
  await rm(tmp, { recursive: true, force: true });
});

describe("attack - cerebrium.toml's unknown names in a refusal", () => {
  it("names made for the edit distance (long, near every known name, many of them) are compared for the first hundred only", () => {
    // 64 characters (the longest compared), each one edit from the last: every comparison runs in full.
    const near = (i: number) => `nam${"e".repeat(60)}${i.toString(36).padStart(1, "0")}`;
    const keys = Array.from({ length: 12_000 }, (_, i) => `${near(i)} = 1`);
    const tables = Array.from({ length: 2_000 }, (_, i) => `[cerebrium.deploymen${i}]\nx = 1`);
    const text = `${refusedToml(keys)}\n${tables.join("\n")}\n`;
    expect(text.length).toBeLessThan(1024 * 1024); // within MAX_CONFIG_BYTES
    let refusal: unknown;
    try {
      parseCerebriumConfig(text, {});
    } catch (err) {
      refusal = err;
    }
    expect(refusal).toBeInstanceOf(AppConfigError);
    const issues = (refusal as AppConfigError).issues;
    // Each name past the first hundred is counted, not compared: the hundred named, and only they have a hint.
    const strangers = issues.filter((i) => i.message.includes("skiff knows"));
    expect(strangers).toHaveLength(100);
    // And the refusal says a part of them, whatever their number.
    expect((refusal as AppConfigError).message.split("\n").length).toBeLessThanOrEqual(51);
  });

  it("the refusal names the unknown keys at most as a warning does (100 of them, 1000 characters each)", async () => {
    // 100 unknown keys of 10,000 characters: a 1 MB file that gzips to a few KB.
    const long = "k".repeat(10_000);
    const keys = Array.from({ length: 100 }, (_, i) => `"${long}${i}" = 1`);
    const bytes = await bundle("long-keys", { "cerebrium.toml": refusedToml(keys), "main.py": "" });
    expect(bytes.length).toBeLessThan(64 * 1024);
    const answer = await deployRest(bytes);
    expect(answer.status).toBe(400);
    expect(answer.message).toMatch(/is not a key skiff knows/);
    // A warning is cut at 1000 characters (the app's log and the deploy's answer): a refusal's lines no longer.
    for (const line of answer.message.split("\n")) expect(line.length).toBeLessThanOrEqual(1100);
    expect(answer.message.length).toBeLessThanOrEqual(128 * 1024);
  }, 60_000);

  it("over gRPC, a refusal this long still reaches the caller as invalid_argument, and the server serves on", async () => {
    const long = "g".repeat(10_000);
    const keys = Array.from({ length: 100 }, (_, i) => `"${long}${i}" = 1`);
    const bytes = await bundle("long-keys-grpc", { "cerebrium.toml": refusedToml(keys), "main.py": "" });
    const client = createClient(
      ManagementService,
      createGrpcTransport({ baseUrl: t.url, interceptors: [bearer(t.devToken)] }),
    );
    const err = await client
      .deployApp({ projectId: P, bundle: { contentType: "application/gzip", data: bytes } })
      .catch((e: unknown) => e);
    expect(err).toBeInstanceOf(ConnectError);
    const code = (err as ConnectError).code;
    expect((await fetch(`${t.url}/healthz`)).status).toBe(200);
    // Now: the trailer that carries the message is too large, and the caller gets "internal" (its HTTP/2 stream
    // reset with NGHTTP2_FRAME_SIZE_ERROR) instead of what is wrong with its file.
    expect(code, (err as ConnectError).message).toBe(Code.InvalidArgument);
  }, 60_000);

  it("a quoted key's control characters (a terminal's escape, NUL, a line end) come back in no refusal", async () => {
    const keys = ['"a\\u001b]0;owned\\u0007\\u001b[2J" = 1', '"b\\u0000c" = 1', '"x\\ncerebrium.toml:1: forged" = 1'];
    const answer = await deployRest(
      await bundle("control-keys", { "cerebrium.toml": refusedToml(keys), "main.py": "" }),
    );
    expect(answer.status).toBe(400);
    expect(answer.message).toMatch(/is not a key skiff knows/);
    expect(answer.message).not.toMatch(/[\u0000-\u0009\u000b-\u001f\u007f]/);
    // A line of the refusal is one of its issues: none is forged by a key.
    expect(answer.message).not.toMatch(/^cerebrium\.toml:1: forged/m);
  }, 60_000);
});
