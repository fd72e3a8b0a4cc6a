// Project secrets through the management API: set (create, then update),
// listing with names and times only, delete, the checks of names and values,
// the per-project count, tokens of another project, and values that appear
// in no answer, log line or KV entry.
import { Writable } from "node:stream";
import { connect, type NatsConnection } from "nats";
import { pino } from "pino";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { buckets } from "../../services/nats/layout.js";
import { startTestSkiff, type TestSkiff } from "../helpers/skiff.js";

const VALUE = "hf_secret_value_0d6c2f41a7";

describe("project secrets", () => {
  let t: TestSkiff;
  let logText = "";

  beforeAll(async () => {
    const sink = new Writable({
      write(chunk, _enc, done) {
        logText += chunk.toString();
        done();
      },
    });
    t = await startTestSkiff({
      logger: pino({ level: "debug" }, sink),
      env: { SKIFF_MAX_SECRETS_PER_PROJECT: "3" },
    });
    expect((await t.api("POST", "/v2/projects", { project_id: "p-a" })).status).toBe(200);
    expect((await t.api("POST", "/v2/projects", { project_id: "p-b" })).status).toBe(200);
  });
  afterAll(async () => {
    await t?.close();
  });

  it("PUT creates a secret, a second PUT updates it; GET lists names and times, never a value", async () => {
    const created = await t.api("PUT", "/v2/projects/p-a/secrets/hf_auth_token", { value: VALUE });
    expect(created.status).toBe(200);
    expect(created.body.created).toBe(true);
    expect(Object.keys(created.body.secret).sort()).toEqual(["created_at", "name", "updated_at"]);
    expect(created.text).not.toContain(VALUE);

    await new Promise((r) => setTimeout(r, 20));
    const updated = await t.api("PUT", "/v2/projects/p-a/secrets/hf_auth_token", { value: `${VALUE}-2` });
    expect(updated.status).toBe(200);
    expect(updated.body.created ?? false).toBe(false);
    expect(updated.body.secret.created_at).toBe(created.body.secret.created_at);
    expect(Date.parse(updated.body.secret.updated_at)).toBeGreaterThan(Date.parse(created.body.secret.updated_at));

    const list = await t.api("GET", "/v2/projects/p-a/secrets");
    expect(list.status).toBe(200);
    expect(list.body.secrets).toEqual([updated.body.secret]);
    expect(list.text).not.toContain(VALUE);
    // Another project's list does not show it.
    expect((await t.api("GET", "/v2/projects/p-b/secrets")).body).toEqual({ secrets: [] });
  });

  it("DELETE answers {}, a second DELETE 404; a deleted name can be set again", async () => {
    expect((await t.api("PUT", "/v2/projects/p-a/secrets/TO_DELETE", { value: "x" })).status).toBe(200);
    expect(await t.api("DELETE", "/v2/projects/p-a/secrets/TO_DELETE")).toMatchObject({ status: 200, body: {} });
    expect(await t.api("DELETE", "/v2/projects/p-a/secrets/TO_DELETE")).toMatchObject({
      status: 404,
      body: { code: "not_found" },
    });
    expect((await t.api("GET", "/v2/projects/p-a/secrets")).body.secrets.map((s: any) => s.name)).not.toContain(
      "TO_DELETE",
    );
    const again = await t.api("PUT", "/v2/projects/p-a/secrets/TO_DELETE", { value: "y" });
    expect(again).toMatchObject({ status: 200, body: { created: true } });
    expect((await t.api("DELETE", "/v2/projects/p-a/secrets/TO_DELETE")).status).toBe(200);
    expect((await t.api("DELETE", "/v2/projects/p-a/secrets/no%20such")).status).toBe(404);
    expect((await t.api("PUT", "/v2/projects/p-nope/secrets/A", { value: "x" })).status).toBe(404);
  });

  it("names that are not variable names, or that skiff sets itself, are 400 naming the field", async () => {
    for (const name of ["1ABC", "A-B", "A.B", "PORT", "PATH", "HOME", "SKIFF_TOKEN", "skiff_gate", "x".repeat(129)]) {
      const res = await t.api("PUT", `/v2/projects/p-a/secrets/${encodeURIComponent(name)}`, { value: "v" });
      expect(res.status, name).toBe(400);
      expect(res.body.code).toBe("invalid_argument");
      expect(res.body.message).toMatch(/^name /);
    }
  });

  it("a value over 64 KiB, or with a NUL, is 400 naming the value, and the error does not repeat it", async () => {
    const big = `${VALUE}${"v".repeat(64 * 1024)}`;
    const res = await t.api("PUT", "/v2/projects/p-a/secrets/BIG", { value: big });
    expect(res).toMatchObject({ status: 400, body: { code: "invalid_argument" } });
    expect(res.body.message).toMatch(/^value is \d+ bytes, more than the 65536 allowed/);
    expect(res.text).not.toContain(VALUE);
    expect((await t.api("PUT", "/v2/projects/p-a/secrets/NUL", { value: "a\u0000b" })).status).toBe(400);
    // Exactly 64 KiB is taken.
    expect((await t.api("PUT", "/v2/projects/p-a/secrets/EXACT", { value: "v".repeat(64 * 1024) })).status).toBe(200);
    expect((await t.api("DELETE", "/v2/projects/p-a/secrets/EXACT")).status).toBe(200);
  });

  it("a token of another project is refused (403); the project's own service account may manage them", async () => {
    const other = await t.api("POST", "/v2/projects/p-b/service-accounts", {
      name: "b",
      expires_at: new Date(Date.now() + 86_400_000).toISOString(),
    });
    const foreign = other.body.token as string;
    expect((await t.api("GET", "/v2/projects/p-a/secrets", undefined, foreign)).status).toBe(403);
    expect((await t.api("PUT", "/v2/projects/p-a/secrets/X", { value: "x" }, foreign)).status).toBe(403);
    expect((await t.api("DELETE", "/v2/projects/p-a/secrets/hf_auth_token", undefined, foreign)).status).toBe(403);
    expect((await t.api("PUT", "/v2/projects/p-b/secrets/OWN", { value: "x" }, foreign)).status).toBe(200);
    expect((await t.api("GET", "/v2/projects/p-b/secrets", undefined, foreign)).body.secrets).toHaveLength(1);
  });

  it("a new secret past SKIFF_MAX_SECRETS_PER_PROJECT is 429; a new value for an existing one is not", async () => {
    // p-a has hf_auth_token; two more reach the limit of 3.
    expect((await t.api("PUT", "/v2/projects/p-a/secrets/S2", { value: "2" })).status).toBe(200);
    expect((await t.api("PUT", "/v2/projects/p-a/secrets/S3", { value: "3" })).status).toBe(200);
    const refused = await t.api("PUT", "/v2/projects/p-a/secrets/S4", { value: "4" });
    expect(refused).toMatchObject({ status: 429, body: { code: "resource_exhausted" } });
    expect(refused.body.message).toMatch(/SKIFF_MAX_SECRETS_PER_PROJECT/);
    expect((await t.api("PUT", "/v2/projects/p-a/secrets/S3", { value: "3b" })).status).toBe(200);
    expect((await t.api("DELETE", "/v2/projects/p-a/secrets/S3")).status).toBe(200);
    expect((await t.api("PUT", "/v2/projects/p-a/secrets/S4", { value: "4" })).status).toBe(200);
  });

  it("values are sealed in KV, and no log line holds one; audit lines name the secret", async () => {
    let nc: NatsConnection | undefined;
    try {
      nc = await connect({ servers: t.nats.url });
      const kv = await nc.jetstream().views.kv(buckets.projectSecrets.name, { bindOnly: true });
      const entry = await kv.get("p-a.hf_auth_token");
      const stored = entry!.string();
      expect(stored).not.toContain(VALUE);
      expect(JSON.parse(stored).sealed).toMatch(/^v1\./);
    } finally {
      await nc?.close();
    }
    expect(logText).toMatch(/secret\.create p-a\/hf_auth_token/);
    expect(logText).toMatch(/secret\.update p-a\/hf_auth_token/);
    expect(logText).not.toContain(VALUE);
  });
});

describe("project secrets - a full bucket", () => {
  it("a secret that does not fit KV skiff-project-secrets' budget is 503 naming SKIFF_KV_MAX_BYTES, not a 500", async () => {
    const t = await startTestSkiff({ env: { SKIFF_KV_MAX_BYTES: "1MB" } });
    try {
      const put = (name: string) =>
        fetch(`${t.url}/v2/projects/p-dev/secrets/${name}`, {
          method: "PUT",
          headers: { authorization: `Bearer ${t.adminToken}`, "content-type": "application/json" },
          body: JSON.stringify({ value: "v".repeat(60 * 1024) }),
        });
      let res = await put("S0");
      for (let i = 1; i < 40 && res.status === 200; i++) res = await put(`S${i}`);
      expect(res.status).toBe(503);
      const body = (await res.json()) as { code: string; message: string };
      expect(body.code).toBe("unavailable");
      expect(body.message).toMatch(/skiff-project-secrets is at its byte budget \(SKIFF_KV_MAX_BYTES\)/);
    } finally {
      await t.close();
    }
  }, 120_000);
});
