// Webhooks end to end: a call with webhookEndpoint through the invocation
// API, the run event, the webhook role and a real receiver.
import { execFileSync } from "node:child_process";
import http from "node:http";
import type { AddressInfo } from "node:net";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { afterAll, beforeAll, describe, expect, it, vi } from "vitest";
import { cortexApp, deploy, P, post } from "../helpers/run-apps.js";
import { verifyWebhook } from "../../services/webhook/signature.js";
import { startTestSkiff, type TestSkiff } from "../helpers/skiff.js";

interface Held {
  headers: http.IncomingHttpHeaders;
  body: Buffer;
  release(status: number): void;
}

/** A receiver that holds every request until the test releases it. */
async function holdingReceiver() {
  const held: Held[] = [];
  const server = http.createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on("data", (c: Buffer) => chunks.push(c));
    req.on("end", () =>
      held.push({
        headers: req.headers,
        body: Buffer.concat(chunks),
        release: (status) => res.writeHead(status).end(),
      }),
    );
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
    held,
    close: () => new Promise<void>((r) => server.close(() => r())),
  };
}

/** HMAC check by an independent implementation (Python's hmac module). */
function pythonVerifies(secret: string, h: http.IncomingHttpHeaders, body: Buffer): boolean {
  const script = [
    "import hmac, hashlib, sys, json",
    "a = json.loads(sys.argv[1])",
    "body = sys.stdin.buffer.read()",
    "mac = hmac.new(a['secret'].encode(), f\"{a['id']}.{a['ts']}.\".encode() + body, hashlib.sha256).hexdigest()",
    "print('ok' if hmac.compare_digest('v1,' + mac, a['sig']) else 'bad')",
  ].join("\n");
  const args = JSON.stringify({
    secret,
    id: h["x-request-id"],
    ts: h["x-service-webhook-timestamp"],
    sig: h["x-service-webhook-signature"],
  });
  return execFileSync("python3", ["-c", script, args], { input: body }).toString().trim() === "ok";
}

describe("webhooks end to end", () => {
  let t: TestSkiff;
  let receiver: Awaited<ReturnType<typeof holdingReceiver>>;
  let tmp: string;

  beforeAll(async () => {
    tmp = await mkdtemp(path.join(tmpdir(), "skiff-webhook-e2e-"));
    t = await startTestSkiff({ env: { SKIFF_WEBHOOK_ALLOWED_CIDRS: "127.0.0.0/8" } });
    receiver = await holdingReceiver();
    await deploy(tmp, t.management(), cortexApp("hooks", { min_replicas: 1 }));
  }, 60_000);
  afterAll(async () => {
    await receiver?.close();
    await t?.close();
    if (tmp) await rm(tmp, { recursive: true, force: true });
  });

  it("a sync call right after a deploy waits for the runner to have the app, answers without waiting for its receiver, which gets the same bytes, signed", async () => {
    const endpoint = encodeURIComponent(`${receiver.url}/sync`);
    // The receiver answers nothing until the caller has its answer: were delivery
    // in the caller's path, this call could not return.
    const res = await post(
      `${t.url}/v4/${P}/hooks/add?webhookEndpoint=${endpoint}`,
      t.devToken,
      JSON.stringify({ a: 2, b: 3 }),
      { "X-Webhook-Secret": "whsec_e2e" },
    );
    expect(res.status).toBe(200);
    expect(res.json.result).toBe(5);
    const runId = res.headers.get("x-request-id");
    const [delivery] = await vi.waitUntil(() => (receiver.held.length >= 1 ? receiver.held : undefined), {
      timeout: 60_000,
    });
    expect(delivery.headers["content-type"]).toBe("application/json");
    expect(delivery.headers["x-request-id"]).toBe(runId);
    expect(delivery.body.equals(Buffer.from(res.text))).toBe(true);
    expect(pythonVerifies("whsec_e2e", delivery.headers, delivery.body)).toBe(true);
    expect(pythonVerifies("whsec_other", delivery.headers, delivery.body)).toBe(false);
    delivery.release(200);
    const admin = t.management();
    await vi.waitUntil(
      async () =>
        (await admin.listWebhookDeliveries({ projectId: P, appName: "hooks", runId: runId! })).deliveries[0]?.state ===
        "delivered",
      { timeout: 60_000 },
    );
    receiver.held.length = 0;
  });

  /** A sync call whose X-Webhook-Secret header carries exactly `secretBytes` on the wire. */
  function callWithSecretBytes(
    secretBytes: Buffer,
    path: string,
  ): Promise<{ status: number; body: string; runId: string }> {
    const url = new URL(`${t.url}/v4/${P}/hooks/add?webhookEndpoint=${encodeURIComponent(`${receiver.url}/${path}`)}`);
    return new Promise((resolve, reject) => {
      const req = http.request(
        url,
        {
          method: "POST",
          headers: {
            authorization: `Bearer ${t.devToken}`,
            "content-type": "application/json",
            // Node writes one byte per character of a header value.
            "x-webhook-secret": secretBytes.toString("latin1"),
          },
        },
        (res) => {
          const chunks: Buffer[] = [];
          res.on("data", (c: Buffer) => chunks.push(c));
          res.on("end", () =>
            resolve({
              status: res.statusCode ?? 0,
              body: Buffer.concat(chunks).toString(),
              runId: String(res.headers["x-request-id"]),
            }),
          );
        },
      );
      req.on("error", reject);
      // A Buffer body: with a string body Node writes the header block as UTF-8 along with it.
      req.end(Buffer.from(JSON.stringify({ a: 1, b: 1 })));
    });
  }

  it("a non-ASCII X-Webhook-Secret signs with its UTF-8 bytes: skiff's verifier and Python's accept the delivery", async () => {
    const secret = "my-s3cret-ü+/=";
    const res = await callWithSecretBytes(Buffer.from(secret, "utf8"), "utf8");
    expect(res.status).toBe(200);
    const [delivery] = await vi.waitUntil(() => (receiver.held.length >= 1 ? receiver.held : undefined), {
      timeout: 60_000,
    });
    expect(delivery.headers["x-request-id"]).toBe(res.runId);
    expect(verifyWebhook({ secret, headers: delivery.headers, body: delivery.body })).toBe(res.runId);
    expect(pythonVerifies(secret, delivery.headers, delivery.body)).toBe(true);
    delivery.release(200);
    receiver.held.length = 0;
  });

  it("an X-Webhook-Secret that is not UTF-8 text is refused with 400 before anything runs", async () => {
    const res = await callWithSecretBytes(Buffer.from([0x6b, 0x65, 0x79, 0xfc]), "latin1");
    expect(res.status).toBe(400);
    expect(JSON.parse(res.body)).toMatchObject({ code: "invalid_argument", message: expect.stringMatching(/UTF-8/) });
    expect(res.runId).toMatch(/^[0-9a-f-]{36}$/);
  });

  it("an async run whose function raised is delivered as its failure, listed with its attempts, and can be redelivered", async () => {
    const res = await post(
      `${t.url}/v4/${P}/hooks/fail?async=true&webhookEndpoint=${encodeURIComponent(`${receiver.url}/async`)}`,
      t.devToken,
      "{}",
    );
    expect(res.status).toBe(202);
    const runId = res.json.run_id as string;
    const [first] = await vi.waitUntil(() => (receiver.held.length >= 1 ? receiver.held : undefined), {
      timeout: 60_000,
    });
    expect(first.headers["x-request-id"]).toBe(runId);
    expect(first.headers["x-service-webhook-signature"]).toBeUndefined(); // no secret, no signature
    expect(JSON.parse(first.body.toString())).toEqual({ run_id: runId, error: { type: "TypeError", message: "nope" } });
    first.release(204);

    const admin = t.management();
    const run = await vi.waitUntil(
      async () => {
        const r = (await admin.getRun({ projectId: P, appName: "hooks", runId })).run;
        return r?.webhookDeliveries[0]?.state === "delivered" ? r : undefined;
      },
      { timeout: 60_000 },
    );
    expect(run.status).toBe("failure");
    expect(run.async).toBe(true);
    expect(run.webhookDeliveries[0].attempts.map((a) => [a.attempt, a.statusCode, a.outcome])).toEqual([
      [1, 204, "delivered"],
    ]);

    const again = await fetch(`${t.url}/v2/projects/${P}/apps/hooks/runs/${runId}/webhook:redeliver`, {
      method: "POST",
      headers: { authorization: `Bearer ${t.devToken}` },
    });
    expect(again.status).toBe(200);
    const [, second] = await vi.waitUntil(() => (receiver.held.length >= 2 ? receiver.held : undefined), {
      timeout: 60_000,
    });
    expect(second.headers["x-request-id"]).toBe(runId);
    expect(second.body.equals(first.body)).toBe(true);
    second.release(200);
    await vi.waitUntil(
      async () => {
        const list = (await admin.listWebhookDeliveries({ projectId: P, appName: "hooks", runId })).deliveries;
        return list.length === 2 && list.every((d) => d.state === "delivered");
      },
      { timeout: 60_000 },
    );
    receiver.held.length = 0;
  });

  it("redelivering a run without a webhook is refused with failed_precondition (400)", async () => {
    const res = await post(`${t.url}/v4/${P}/hooks/add`, t.devToken, JSON.stringify({ a: 1, b: 1 }));
    const runId = res.headers.get("x-request-id")!;
    await vi.waitUntil(
      async () =>
        (
          await t
            .management()
            .getRun({ projectId: P, appName: "hooks", runId })
            .catch(() => undefined)
        )?.run?.status === "success",
      { timeout: 60_000 },
    );
    const again = await fetch(`${t.url}/v2/projects/${P}/apps/hooks/runs/${runId}/webhook:redeliver`, {
      method: "POST",
      headers: { authorization: `Bearer ${t.devToken}` },
    });
    expect(again.status).toBe(400);
    expect(((await again.json()) as { code: string }).code).toBe("failed_precondition");
  });
});
