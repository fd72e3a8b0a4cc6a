import { execFileSync } from "node:child_process";
import { randomBytes } from "node:crypto";
import { afterAll, beforeAll, describe, expect, test, vi } from "vitest";
import type { WebhookDelivery } from "../../gen/skiff/management/v2/management_pb.js";
import { buckets, objectStores, streams } from "../../services/nats/layout.js";
import { createSecretBox, secretsBucket, storeWebhookSecret } from "../../services/webhooks/secrets.js";
import { listDeliveries, redeliver, RedeliveryError } from "../../services/webhooks/deliveries.js";
import { MAX_DELAY_MS } from "../../services/webhook/retry-policy.js";
import { WEBHOOK_CONSUMER } from "../../services/webhook/role.js";
import { verifyWebhook } from "../../services/webhook/signature.js";
import { newRunId, publishRunEvent, terminalEvent } from "../helpers/webhook-events.js";
import { settled, startWebhookHarness, type WebhookHarness } from "../helpers/webhook-harness.js";
import {
  refusedUrl,
  startReceiver,
  type Answer,
  type Receiver,
  type ReceivedRequest,
} from "../helpers/webhook-receiver.js";

/**
 * The role's attempt deadline: the receiver answers at once except on /hang,
 * so this only has to outlast a loaded machine's answer time (2 s did not:
 * a CI run with the cores busy timed out a 200 answer and retried it).
 */
const TIMEOUT_MS = 5_000;

/** Receiver paths: /s/<status> answers that status (3xx point Location at /followed), /hang never answers, /flaky/<id> 404 then 200, /once/<id> 400 then 200. */
function answer(path: string, n: number): Answer {
  const [, kind, arg] = path.split("/");
  if (kind === "hang") return "hang";
  if (kind === "flaky") return n === 1 ? 404 : 200;
  if (kind === "once") return n === 1 ? 400 : 200;
  if (kind === "s") {
    const status = Number(arg);
    return status >= 300 && status < 400 ? { status, headers: { location: "/followed" } } : status;
  }
  return 200;
}

const millis = (t: { seconds: bigint; nanos: number } | undefined) => Number(t!.seconds) * 1000 + t!.nanos / 1e6;

/** Wait between the end of one attempt and the start of the next, from the delivery's own record. */
function gaps(d: WebhookDelivery): number[] {
  return d.attempts
    .slice(1)
    .map((a, i) => millis(a.startedAt) - (millis(d.attempts[i].startedAt) + d.attempts[i].durationMs));
}

function arrivalGaps(reqs: ReceivedRequest[]): number[] {
  return reqs.slice(1).map((r, i) => r.at - reqs[i].at);
}

describe("webhook delivery (SSRF guard exempting 127.0.0.0/8)", () => {
  let h: WebhookHarness;
  let rx: Receiver;
  beforeAll(async () => {
    h = await startWebhookHarness();
    rx = await startReceiver(answer);
    await h.startRole({ timeoutMs: TIMEOUT_MS });
  });
  afterAll(async () => {
    await h?.close();
    await rx?.close();
  });

  /** The data of every message a stream holds. */
  async function storedMessages(stream: string): Promise<Uint8Array[]> {
    const jsm = await h.nc.jetstreamManager();
    const { state } = await jsm.streams.info(stream);
    const out: Uint8Array[] = [];
    for (let seq = state.first_seq; seq <= state.last_seq; seq++) {
      // A KV keeps only the latest revision of each key: older sequences are gone.
      const m = await jsm.streams.getMessage(stream, { seq }).catch(() => undefined);
      if (m !== undefined) out.push(m.data);
    }
    return out;
  }

  test("webhook - every row of the spec's retry table: 3 attempts where retried, 1 where not, gaps ≤ 5 s, redirects not followed", async () => {
    const rows = [
      { name: "connection refused", url: await refusedUrl(), attempts: 3, state: "failed", error: /ECONNREFUSED/ },
      {
        name: "no answer within the timeout",
        url: `${rx.url}/hang`,
        attempts: 3,
        state: "failed",
        error: new RegExp(`no answer within ${TIMEOUT_MS} ms`),
      },
      // The query may carry a token: it must not reach the logs.
      { name: "404", url: `${rx.url}/s/404?token=query-sekret`, attempts: 3, state: "failed", status: 404 },
      ...[400, 401, 410].map((s) => ({
        name: String(s),
        url: `${rx.url}/s/${s}`,
        attempts: 1,
        state: "failed",
        status: s,
      })),
      ...[500, 503].map((s) => ({ name: String(s), url: `${rx.url}/s/${s}`, attempts: 1, state: "failed", status: s })),
      ...[301, 302].map((s) => ({ name: String(s), url: `${rx.url}/s/${s}`, attempts: 3, state: "failed", status: s })),
      ...[200, 201, 204].map((s) => ({
        name: String(s),
        url: `${rx.url}/s/${s}`,
        attempts: 1,
        state: "delivered",
        status: s,
      })),
    ];
    const events = rows.map((r) => terminalEvent(r.url, `{"row":"${r.name}"}`));
    await Promise.all(events.map((e) => publishRunEvent(h.nc, e)));
    // /hang's three attempts take three deadlines and two waits between them.
    const results = await Promise.all(
      events.map((e) => h.waitForDeliveries(e.runId, settled, 3 * TIMEOUT_MS + 2 * MAX_DELAY_MS + 20_000)),
    );

    rows.forEach((row, i) => {
      const [d, ...more] = results[i];
      expect(more, row.name).toHaveLength(0);
      expect(d.state, row.name).toBe(row.state);
      expect(
        d.attempts.map((a) => a.attempt),
        row.name,
      ).toEqual(Array.from({ length: row.attempts }, (_, k) => k + 1));
      expect(
        d.attempts.map((a) => a.outcome),
        row.name,
      ).toEqual([...Array(row.attempts - 1).fill("retry"), row.state]);
      for (const a of d.attempts) {
        if (row.status !== undefined) expect(a.statusCode, row.name).toBe(row.status);
        else expect([a.statusCode, a.error], row.name).toEqual([0, expect.stringMatching(row.error!)]);
      }
      for (const g of gaps(d)) {
        expect(g, `${row.name}: gap between attempts`).toBeGreaterThan(0);
        expect(g, `${row.name}: gap between attempts`).toBeLessThanOrEqual(MAX_DELAY_MS);
      }
      if (row.url.startsWith(rx.url)) {
        const path = new URL(row.url).pathname;
        const got = rx.to(path);
        expect(got, `${row.name}: requests the receiver got`).toHaveLength(row.attempts);
        for (const g of arrivalGaps(got)) expect(g).toBeGreaterThan(0);
        for (const g of arrivalGaps(got)) expect(g).toBeLessThanOrEqual(MAX_DELAY_MS + TIMEOUT_MS + 200);
      }
    });
    expect(rx.to("/followed"), "a redirect is never followed").toHaveLength(0);

    // Each failed delivery is logged once, with run id, host and every attempt's outcome; never the URL's path or query.
    const failures = h.logs.map((l) => JSON.parse(l)).filter((l) => l.level === 50);
    rows.forEach((row, i) => {
      const logged = failures.filter((l) => l.runId === events[i].runId);
      expect(logged, row.name).toHaveLength(row.state === "failed" ? 1 : 0);
      if (row.state !== "failed") return;
      expect(logged[0].host).toBe(new URL(row.url).host);
      expect(logged[0].attempts).toHaveLength(row.attempts);
      expect(logged[0].attempts.at(-1).outcome).toBe("failed");
    });
    expect(h.logs.join("\n")).not.toContain("query-sekret");
    expect(h.logs.join("\n")).not.toContain("/s/404");
  });

  test("webhook - signed deliveries verify with an independent python hmac, each attempt signed afresh, body byte for byte", async () => {
    const secret = `whsec_${randomBytes(12).toString("hex")}`;
    const box = await createSecretBox(h.nc);
    const kv = await secretsBucket(h.nc);
    const bodies = [
      '{"run_id":"x","result":{"greeting":"héllo wörld ☃ 日本語 🚀"},"run_time_ms":1.5}',
      '{ "a" :\t1 ,\n\n  "b" : [ ] }  \r\n\t ',
    ];
    const events = bodies.map((b, i) => terminalEvent(`${rx.url}/flaky/signed-${i}`, b, { webhookSigned: true }));
    for (const e of events) await storeWebhookSecret(kv, box, e.runId, secret);
    const before = Math.floor(Date.now() / 1000);
    await Promise.all(events.map((e) => publishRunEvent(h.nc, e)));
    await Promise.all(events.map((e) => h.waitForDeliveries(e.runId, settled)));

    const attempts = events.flatMap((e, i) => rx.to(`/flaky/signed-${i}`).map((r) => ({ e, r, body: bodies[i] })));
    expect(attempts).toHaveLength(4); // a 404, then the 200, for each
    for (const { e, r, body } of attempts) {
      expect(r.method).toBe("POST");
      expect(r.body.equals(Buffer.from(body, "utf8")), "body bytes").toBe(true);
      expect(r.headers["content-type"]).toBe("application/json");
      expect(r.headers["user-agent"]).toBe("skiff-webhook/1");
      expect(r.headers["x-request-id"]).toBe(e.runId);
      const ts = Number(r.headers["x-service-webhook-timestamp"]);
      expect(ts).toBeGreaterThanOrEqual(before);
      expect(ts).toBeLessThanOrEqual(Math.floor(r.at / 1000));
      expect(r.headers["x-service-webhook-signature"]).toMatch(/^v1,[0-9a-f]{64}$/);
      expect(verifyWebhook({ secret, headers: r.headers, body: r.body })).toBe(e.runId);
    }

    // An implementation that shares no code with skiff; the last case, with a changed body, must not verify.
    const cases = attempts.map(({ r }) => ({
      secret,
      request_id: r.headers["x-request-id"],
      timestamp: r.headers["x-service-webhook-timestamp"],
      signature: r.headers["x-service-webhook-signature"],
      body: r.body.toString("base64"),
    }));
    cases.push({ ...cases[0], body: Buffer.from(bodies[0] + " ").toString("base64") });
    const python = `
import base64, hashlib, hmac, json, sys
out = []
for c in json.load(sys.stdin):
    signed = f"{c['request_id']}.{c['timestamp']}.".encode() + base64.b64decode(c["body"])
    expected = "v1," + hmac.new(c["secret"].encode(), signed, hashlib.sha256).hexdigest()
    out.append(hmac.compare_digest(expected, c["signature"]))
print(json.dumps(out))
`;
    const verdicts = JSON.parse(execFileSync("python3", ["-c", python], { input: JSON.stringify(cases) }).toString());
    expect(verdicts).toEqual([...attempts.map(() => true), false]);
  });

  test("webhook - without a secret there are no signature headers", async () => {
    const e = terminalEvent(`${rx.url}/s/200/unsigned`, '{"ok":true}');
    await publishRunEvent(h.nc, e);
    await h.waitForDeliveries(e.runId, settled);
    const [r] = rx.to("/s/200/unsigned");
    expect(r.headers["x-request-id"]).toBe(e.runId);
    expect(Object.keys(r.headers).filter((k) => k.startsWith("x-service-webhook"))).toEqual([]);
  });

  test("webhook - a first attempt writes its run's entry once before the POST and reads nothing; its outcome is the one write after", async () => {
    const e = terminalEvent(`${rx.url}/s/200/one-write`, '{"ok":true}');
    // The KV writes for this run, the JetStream API requests that name it (a read of a key names it, in its subject
    // or its body; the retries of earlier tests' deliveries go on meanwhile), and the delivery's record for the run
    // history, which the role publishes once the delivery is over and written.
    const seen: { subject: string; data: string }[] = [];
    let over = false;
    const subs = [
      h.nc.subscribe(`$JS.API.>`, {
        callback: (_err, m) => {
          if (m.subject.includes(e.runId) || m.string().includes(e.runId)) seen.push({ subject: m.subject, data: "" });
        },
      }),
      h.nc.subscribe(`$KV.${buckets.webhooks.name}.${e.runId}`, {
        callback: (_err, m) => seen.push({ subject: m.subject, data: m.string() }),
      }),
      h.nc.subscribe(`$KV.${buckets.secrets.name}.${e.runId}`, {
        callback: (_err, m) => seen.push({ subject: m.subject, data: m.string() }),
      }),
      h.nc.subscribe("skiff.history.delivered.>", {
        callback: (_err, m) => (over ||= m.headers?.get("Skiff-Delivery")?.includes(e.runId) ?? false),
      }),
    ];
    try {
      await publishRunEvent(h.nc, e);
      await vi.waitFor(() => expect(over).toBe(true), { timeout: 30_000 });
      await h.nc.flush();
      const writes = seen.filter((s) => s.subject.startsWith("$KV."));
      expect(writes.map((w) => w.subject)).toEqual([
        `$KV.${buckets.webhooks.name}.${e.runId}`,
        `$KV.${buckets.webhooks.name}.${e.runId}`,
      ]);
      type Entry = { deliveries: { attempts: { attempt: number; outcome?: string }[] }[] };
      const [started, ended] = writes.map((w) => (JSON.parse(w.data) as Entry).deliveries[0].attempts);
      expect(started).toEqual([expect.objectContaining({ attempt: 1 })]);
      expect(started[0].outcome).toBeUndefined();
      expect(ended).toEqual([expect.objectContaining({ attempt: 1, outcome: "delivered" })]);
      expect(seen.filter((s) => !s.subject.startsWith("$KV.")).map((s) => s.subject)).toEqual([]);
      expect(rx.to("/s/200/one-write")).toHaveLength(1);
    } finally {
      for (const s of subs) s.unsubscribe();
    }
  });

  test("webhook - a signed call whose secret is gone fails the delivery rather than send it unsigned", async () => {
    const e = terminalEvent(`${rx.url}/s/200/lost-secret`, "{}", { webhookSigned: true });
    await publishRunEvent(h.nc, e);
    const [d] = await h.waitForDeliveries(e.runId, settled);
    expect(d.state).toBe("failed");
    expect(d.attempts.map((a) => [a.statusCode, a.outcome])).toEqual([[0, "failed"]]);
    expect(d.attempts[0].error).toMatch(/secret has expired/);
    expect(rx.to("/s/200/lost-secret")).toHaveLength(0);
  });

  test("webhook - the secret never appears in events, KV webhook records or logs", async () => {
    const secret = `whsec_never_${randomBytes(8).toString("hex")}`;
    const box = await createSecretBox(h.nc);
    const kv = await secretsBucket(h.nc);
    // One delivered, one failed after 3 attempts (so an error is logged).
    const signed = [
      terminalEvent(`${rx.url}/s/200/secret`, "{}", { webhookSigned: true }),
      terminalEvent(`${rx.url}/s/404/secret`, "{}", { webhookSigned: true }),
    ];
    for (const e of signed) await storeWebhookSecret(kv, box, e.runId, secret);
    await Promise.all(signed.map((e) => publishRunEvent(h.nc, e)));
    await Promise.all(signed.map((e) => h.waitForDeliveries(e.runId, settled)));
    expect(rx.to("/s/404/secret")).toHaveLength(3);

    const needle = Buffer.from(secret);
    const events = [...(await storedMessages(streams.events.name)), ...(await storedMessages(streams.webhooks.name))];
    expect(events.length).toBeGreaterThan(0);
    for (const m of events) expect(Buffer.from(m).includes(needle), "an event").toBe(false);
    const records = await storedMessages(`KV_${buckets.webhooks.name}`);
    expect(records.length).toBeGreaterThan(0);
    for (const m of records) expect(Buffer.from(m).includes(needle), "a webhook record").toBe(false);
    expect(h.logs.length).toBeGreaterThan(0);
    expect(h.logs.join("\n")).not.toContain(secret);
    // Kept sealed: the stored value is not the secret in any plain form.
    const sealed = (await kv.get(signed[0].runId))!.string();
    expect(sealed).not.toContain(secret);
    expect(sealed).not.toContain(Buffer.from(secret).toString("base64"));
  });

  test("webhook - redeliver makes a fresh set of attempts; listDeliveries shows each attempt's time, status and duration", async () => {
    const started = Date.now();
    const e = terminalEvent(`${rx.url}/once/redeliver`, '{"again":true}');
    await publishRunEvent(h.nc, e);
    const [first] = await h.waitForDeliveries(e.runId, settled);
    expect(first).toMatchObject({ deliveryId: "1", runId: e.runId, url: e.webhookEndpoint, state: "failed" });
    expect(first.attempts.map((a) => [a.attempt, a.statusCode, a.outcome])).toEqual([[1, 400, "failed"]]);

    const fresh = await redeliver(h.nc, e.runId);
    expect(fresh).toMatchObject({
      deliveryId: "2",
      runId: e.runId,
      url: e.webhookEndpoint,
      state: "pending",
      attempts: [],
    });
    const all = await h.waitForDeliveries(e.runId, (d) => d.length === 2 && settled(d));
    expect(all.map((d) => [d.deliveryId, d.state])).toEqual([
      ["1", "failed"],
      ["2", "delivered"],
    ]);
    expect(all[1].attempts.map((a) => [a.attempt, a.statusCode, a.error, a.outcome])).toEqual([
      [1, 200, "", "delivered"],
    ]);
    for (const a of all.flatMap((d) => d.attempts)) {
      expect(millis(a.startedAt)).toBeGreaterThanOrEqual(started - 1000);
      expect(millis(a.startedAt)).toBeLessThanOrEqual(Date.now());
      expect(a.durationMs).toBeGreaterThanOrEqual(0);
      expect(a.durationMs).toBeLessThan(TIMEOUT_MS);
    }
    const got = rx.to("/once/redeliver");
    expect(got).toHaveLength(2);
    expect(got.map((r) => r.headers["x-request-id"])).toEqual([e.runId, e.runId]);
    expect(got.map((r) => r.body.toString())).toEqual(['{"again":true}', '{"again":true}']);
  });

  test("webhook - redelivery of a run without a webhook is a RedeliveryError (no_webhook)", async () => {
    const e = terminalEvent("", "{}");
    await publishRunEvent(h.nc, e);
    await expect(redeliver(h.nc, e.runId)).rejects.toMatchObject({ name: "RedeliveryError", reason: "no_webhook" });
    await expect(redeliver(h.nc, newRunId())).rejects.toBeInstanceOf(RedeliveryError);
  });

  test("webhook - only terminal events with a webhookEndpoint are delivered; cancelled only with a response; all are acked", async () => {
    const url = (p: string) => `${rx.url}/s/200/only-${p}`;
    const skipped = [
      terminalEvent(url("queued"), "", { status: "queued", response: undefined }),
      terminalEvent(url("running"), "", { status: "running", response: undefined }),
      terminalEvent(url("cancelled-queued"), "", { status: "cancelled", response: undefined }),
      terminalEvent("", "{}"),
    ];
    const delivered = [
      terminalEvent(url("failure"), '{"error":"boom"}', { status: "failure", statusCode: 500 }),
      terminalEvent(url("cancelled-running"), '{"partial":1}', { status: "cancelled" }),
    ];
    for (const e of [...skipped, ...delivered]) await publishRunEvent(h.nc, e);
    await Promise.all(delivered.map((e) => h.waitForDeliveries(e.runId, settled)));
    expect(rx.to(new URL(url("failure")).pathname)[0].body.toString()).toBe('{"error":"boom"}');
    expect(rx.to(new URL(url("cancelled-running")).pathname)).toHaveLength(1);
    // Everything consumed and acked, so the skipped events have been seen.
    const jsm = await h.nc.jetstreamManager();
    await expect
      .poll(async () => {
        const info = await jsm.consumers.info(streams.webhooks.name, WEBHOOK_CONSUMER);
        return [info.num_pending, info.num_ack_pending];
      })
      .toEqual([0, 0]);
    for (const e of skipped) {
      expect(await listDeliveries(h.nc, e.runId)).toEqual([]);
      if (e.webhookEndpoint) expect(rx.to(new URL(e.webhookEndpoint).pathname)).toHaveLength(0);
    }
  });

  test("webhook - a response kept in the skiff-results object store is sent byte for byte", async () => {
    const body = Buffer.concat([Buffer.from('{"big":"'), Buffer.alloc(300_000, "é"), Buffer.from('"}')]);
    const name = `result-${newRunId()}`;
    const os = await h.nc.jetstream().views.os(objectStores.results.name);
    await os.putBlob({ name }, body);
    const e = terminalEvent(`${rx.url}/s/200/object`, "", { response: undefined, responseObject: name });
    await publishRunEvent(h.nc, e);
    await h.waitForDeliveries(e.runId, settled);
    expect(rx.to("/s/200/object")[0].body.equals(body)).toBe(true);
  });

  test("webhook - two webhook processes share the work and never repeat an attempt", async () => {
    await h.startRole({ timeoutMs: TIMEOUT_MS });
    const events = Array.from({ length: 8 }, (_, i) => terminalEvent(`${rx.url}/s/404/shared-${i}`, "{}"));
    await Promise.all(events.map((e) => publishRunEvent(h.nc, e)));
    const results = await Promise.all(events.map((e) => h.waitForDeliveries(e.runId, settled)));
    events.forEach((_, i) => {
      expect(rx.to(`/s/404/shared-${i}`)).toHaveLength(3);
      expect(results[i][0].attempts.map((a) => a.attempt)).toEqual([1, 2, 3]);
    });
  });
});

describe("webhook delivery (default SSRF guard)", () => {
  let h: WebhookHarness;
  let rx: Receiver;
  beforeAll(async () => {
    h = await startWebhookHarness();
    rx = await startReceiver(() => 200);
    await h.startRole({ allowedCidrs: [] });
  });
  afterAll(async () => {
    await h?.close();
    await rx?.close();
  });

  test.each([
    ["an IP literal", () => `${rx.url}/blocked`],
    ["a name resolving to loopback", () => `http://localhost:${rx.port}/blocked`],
  ])("webhook - a blocked address (%s) fails at once with a clear error and no connection", async (_, url) => {
    const e = terminalEvent(url(), "{}");
    await publishRunEvent(h.nc, e);
    const [d] = await h.waitForDeliveries(e.runId, settled);
    expect(d.state).toBe("failed");
    expect(d.attempts).toHaveLength(1);
    expect(d.attempts[0]).toMatchObject({ statusCode: 0, outcome: "failed" });
    expect(d.attempts[0].error).toMatch(/resolves to (127\.0\.0\.1|::1).*SKIFF_WEBHOOK_ALLOWED_CIDRS/);
    expect(rx.requests).toHaveLength(0);
  });

  test("webhook - redelivery after the run's event has left SKIFF_WEBHOOKS is a RedeliveryError (event_gone)", async () => {
    const e = terminalEvent(`${rx.url}/blocked/gone`, "{}");
    await publishRunEvent(h.nc, e);
    await h.waitForDeliveries(e.runId, settled);
    await (await h.nc.jetstreamManager()).streams.purge(streams.webhooks.name);
    await expect(redeliver(h.nc, e.runId)).rejects.toMatchObject({ name: "RedeliveryError", reason: "event_gone" });
    expect(await listDeliveries(h.nc, e.runId)).toHaveLength(1);
  });
});
