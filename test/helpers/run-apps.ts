// Apps for the run tests, deployed for real through DeployApp, and small
// helpers to call them over REST.
import type { Client } from "@connectrpc/connect";
import type { ManagementService } from "../../gen/skiff/management/v2/management_pb.js";
import { packApp } from "../../services/apps/bundle.js";
import { skiffToml, writeApp, type Scaling } from "./apps.js";

export const P = "p-dev";

/** A Cortex Node app: add, fail (raises), sleep (ms), _hidden (private). */
export function cortexApp(name: string, scaling: Scaling): Record<string, string> {
  return {
    "skiff.toml": skiffToml({ name, runtime: { kind: "cortex", language: "node", entry: "index.mjs" }, scaling }),
    "index.mjs": [
      "export function add({ a, b }) { return a + b; }",
      "export function fail() { throw new TypeError('nope'); }",
      "export async function sleep({ ms }) { await new Promise((r) => setTimeout(r, ms)); return { slept: ms }; }",
      "export function big({ n }) { return 'x'.repeat(n); }",
      "export function _hidden() { return 'secret'; }",
    ].join("\n"),
  };
}

export async function deploy(
  tmp: string,
  client: Client<typeof ManagementService>,
  files: Record<string, string>,
  projectId = P,
): Promise<void> {
  const dir = await writeApp(tmp, files);
  await client.deployApp({
    projectId,
    bundle: { contentType: "application/gzip", data: (await packApp(dir)).bytes },
  });
}

export interface Answer {
  status: number;
  headers: Headers;
  text: string;
  json: any; // eslint-disable-line @typescript-eslint/no-explicit-any
}

export async function post(
  url: string,
  token: string | undefined,
  body: string | Uint8Array,
  headers: Record<string, string> = {},
): Promise<Answer> {
  const res = await fetch(url, {
    method: "POST",
    headers: { "content-type": "application/json", ...(token ? { authorization: `Bearer ${token}` } : {}), ...headers },
    body,
  });
  const text = await res.text();
  let json: unknown;
  try {
    json = JSON.parse(text);
  } catch {
    json = undefined;
  }
  return { status: res.status, headers: res.headers, text, json };
}

export const UUID_V7 = /^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/;
