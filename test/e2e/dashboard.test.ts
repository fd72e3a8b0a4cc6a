// The dashboard in a real browser (Debian's chromium through playwright-core)
// against a real skiff: sign in, API keys with the token shown once, an async
// run that failed marked `async` and `failure` live, its webhook attempts and
// a redelivery, every app's runs at once, a Custom app's 4xx answer, sync
// runs' pages, the apps page, the Secrets page (set, replace, a refused name,
// delete after a confirmation, never a value shown), and every page on a
// 390 px wide phone. Each page's screenshot goes to test-results/screenshots/.
// One file, so that one skiff and one browser serve every page's tests.
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { Code, ConnectError } from "@connectrpc/connect";
import pg from "pg";
import type { Browser, BrowserContext, Locator, Page } from "playwright-core";
import { afterAll, afterEach, beforeAll, describe, expect, it, vi } from "vitest";
import { packApp } from "../../services/apps/bundle.js";
import { skiffToml, writeApp } from "../helpers/apps.js";
import {
  collectProblems,
  computedStyle,
  ensureDashboardBuilt,
  launchChromium,
  overflowsViewport,
  screenshot,
  smallestTextHeight,
} from "../helpers/browser.js";
import { startTestSkiff, type TestSkiff } from "../helpers/skiff.js";
import { startReceiver, type Receiver } from "../helpers/webhook-receiver.js";

const P = "p-dev";
const APP = "dash-demo";
/** A Custom app, deployed by the all-apps test: a second app in P. */
const WEB = "dash-web";
// Page-side expressions are strings: the tests type-check without the DOM library.
const TOKEN_IN_SESSION = 'sessionStorage.getItem("skiff.token")';

let t: TestSkiff;
let browser: Browser;
let receiver: Receiver;
let tmp: string;
let context: BrowserContext;
let page: Page;
let problems: string[];

/** A Cortex app with a function that raises and one that answers. */
async function deployDemo(): Promise<void> {
  const dir = await writeApp(tmp, {
    "skiff.toml": skiffToml({
      name: APP,
      runtime: { kind: "cortex", language: "node", entry: "index.mjs" },
      scaling: { max_replicas: 1 },
    }),
    "index.mjs": [
      "export function boom() { throw new RangeError('the dial went past eleven'); }",
      "export function hello({ name }) { return { message: `Hello, ${name}!` }; }",
    ].join("\n"),
  });
  await t
    .management()
    .deployApp({ projectId: P, bundle: { contentType: "application/gzip", data: (await packApp(dir)).bytes } });
}

/** A Custom app answering 404 on /missing/…, 200 with the path it got elsewhere. */
async function deployWeb(): Promise<void> {
  const dir = await writeApp(tmp, {
    "skiff.toml": skiffToml({
      name: WEB,
      runtime: { kind: "custom", command: ["node", "server.mjs"], healthcheck: "/health" },
      scaling: { max_replicas: 1 },
    }),
    "server.mjs": [
      'import http from "node:http";',
      "http",
      "  .createServer((req, res) => {",
      '    if (req.url === "/health") return res.end("ok");',
      '    const missing = req.url.startsWith("/missing");',
      '    res.writeHead(missing ? 404 : 200, { "content-type": "application/json" });',
      '    res.end(JSON.stringify(missing ? { error: "no such page" } : { served: req.url }));',
      "  })",
      "  .listen(Number(process.env.PORT));",
    ].join("\n"),
  });
  await t
    .management()
    .deployApp({ projectId: P, bundle: { contentType: "application/gzip", data: (await packApp(dir)).bytes } });
}

/** A call of `app` at `path`; the run id is the X-Request-Id of the answer. */
async function call(
  app: string,
  fn: string,
  query: Record<string, string>,
  body: unknown = {},
): Promise<{ status: number; runId: string; json: { run_id?: string } }> {
  const res = await fetch(`${t.url}/v4/${P}/${app}/${fn}?${new URLSearchParams(query)}`, {
    method: "POST",
    headers: { authorization: `Bearer ${t.adminToken}`, "content-type": "application/json" },
    body: JSON.stringify(body),
  });
  return {
    status: res.status,
    runId: res.headers.get("x-request-id") ?? "",
    json: (await res.json()) as { run_id?: string },
  };
}

const invoke = (fn: string, query: Record<string, string>, body: unknown = {}) => call(APP, fn, query, body);

async function signIn(token: string): Promise<void> {
  await page.goto(t.url + "/");
  await page.getByLabel("API token").fill(token);
  await page.getByRole("button", { name: "Sign in" }).click();
  await page.getByRole("button", { name: "Sign out" }).waitFor();
}

beforeAll(async () => {
  tmp = await mkdtemp(path.join(tmpdir(), "skiff-dashboard-"));
  [, t, browser, receiver] = await Promise.all([
    ensureDashboardBuilt(),
    startTestSkiff(),
    launchChromium(),
    // The first attempt meets a 404 (retried, per spec 6.2), the next ones a 200.
    startReceiver((_path, n) => (n === 1 ? 404 : 200)),
  ]);
  await deployDemo();
});
afterAll(async () => {
  await browser?.close();
  await receiver?.close();
  await t?.close();
  if (tmp) await rm(tmp, { recursive: true, force: true });
});

/** A new tab, 1280 px wide, or a phone's 390 × 844. */
async function freshPage(device: "desktop" | "phone" = "desktop"): Promise<void> {
  context = await browser.newContext(
    device === "phone"
      ? { viewport: { width: 390, height: 844 }, deviceScaleFactor: 2, isMobile: true, hasTouch: true }
      : { viewport: { width: 1280, height: 860 } },
  );
  page = await context.newPage();
  // Well inside the test's own timeout, so a missing element is reported as such.
  page.setDefaultTimeout(10_000);
  problems = collectProblems(page);
}
afterEach(async (ctx) => {
  if (ctx.task.result?.state === "fail" && page && !page.isClosed())
    await screenshot(page, `failed-${ctx.task.name.slice(0, 40).replace(/\W+/g, "-")}`);
  await context?.close();
});

describe("dashboard - served by the management role", () => {
  it("/ is the dashboard; API paths stay the API's (an unknown one is still a JSON 404)", async () => {
    const home = await fetch(t.url + "/projects/p-dev/runs");
    expect(home.status).toBe(200);
    expect(home.headers.get("content-type")).toBe("text/html; charset=utf-8");
    expect(await home.text()).toContain('<div id="root"></div>');
    const unknown = await fetch(t.url + "/v3/nothing");
    expect(unknown.status).toBe(404);
    expect(await unknown.json()).toEqual({ code: "not_found", message: "no route for /v3/nothing" });
    expect((await fetch(t.url + "/healthz")).status).toBe(200);
    expect((await fetch(t.url + "/projects", { method: "POST" })).status).toBe(404);
  });
});

describe("dashboard - sign in", () => {
  it("a wrong token is refused with what to do; the admin token of a skiff with one project lands in it, and the session survives a reload until sign out", async () => {
    // This test runs before any other project is created.
    expect((await t.management().listProjects({})).projects.map((p) => p.projectId)).toEqual([P]);
    await freshPage();
    await page.goto(t.url + "/");
    await screenshot(page, "01-sign-in");
    await page.getByLabel("API token").fill("not-a-token");
    await page.getByRole("button", { name: "Sign in" }).click();
    await expect.poll(() => page.getByRole("alert").textContent()).toContain("refused the token");

    await page.getByLabel("API token").fill(t.adminToken);
    await page.getByRole("button", { name: "Sign in" }).click();
    // No list of one project to choose from: straight to its runs.
    await page.waitForURL(`**/projects/${P}/runs?app=${APP}`);
    await page.getByRole("heading", { name: "Runs" }).waitFor();
    expect(await page.getByRole("heading", { name: "Projects" }).count()).toBe(0);
    expect(await page.getByLabel("Project", { exact: true }).inputValue()).toBe(P);
    expect(await page.getByText("Signed in as admin").count()).toBe(1);
    await page.reload();
    await page.getByRole("heading", { name: "Runs" }).waitFor();
    expect(await page.evaluate(TOKEN_IN_SESSION)).toBe(t.adminToken);

    await page.getByRole("button", { name: "Sign out" }).click();
    await page.getByLabel("API token").waitFor();
    expect(await page.evaluate(TOKEN_IN_SESSION)).toBeNull();
    expect(problems.filter((p) => !p.includes("401"))).toEqual([]);
  });

  it("an admin with several projects chooses one from the list; the brand link comes back to it", async () => {
    await t.management().createProject({ projectId: "p-second", name: "second" });
    await freshPage();
    await signIn(t.adminToken);
    await page.getByRole("heading", { name: "Projects" }).waitFor();
    expect(page.url()).toBe(`${t.url}/projects`);
    const project = page.getByRole("listitem").filter({ hasText: P }).getByRole("link");
    await project.waitFor();
    expect(await page.getByRole("listitem").filter({ hasText: "p-second" }).count()).toBe(1);
    await screenshot(page, "02-projects");
    await project.click();
    await page.waitForURL(`**/projects/${P}/runs?app=${APP}`);
    await page.getByRole("link", { name: "skiff", exact: true }).click();
    await page.getByRole("heading", { name: "Projects" }).waitFor();
    expect(problems).toEqual([]);
  });

  it("a service account sees its own project without choosing", async () => {
    await freshPage();
    await signIn(t.devToken);
    await page.waitForURL(`**/projects/${P}/runs?app=*`);
    expect(await page.getByText(`Project ${P}`).count()).toBe(1);
    expect(await page.getByText("Signed in as service account sa-dev").count()).toBe(1);
    expect(problems).toEqual([]);
  });
});

describe("dashboard - API keys", () => {
  it("creates a service account whose token is shown once, works, is gone after navigation, and dies with the account", async () => {
    await freshPage();
    await signIn(t.adminToken);
    await page.goto(`${t.url}/projects/${P}/keys`);
    await page.getByRole("heading", { name: "Recommended practices" }).waitFor();
    for (const practice of [
      "One service account per environment",
      "Store tokens as secrets",
      "Set an expiry date and rotate tokens",
      "Never commit tokens to source control",
    ]) {
      expect(await page.getByText(practice).count(), practice).toBe(1);
    }

    await page.getByLabel("Name").fill("ci-staging");
    const expiry = new Date(Date.now() + 30 * 86_400_000).toISOString().slice(0, 10);
    await page.getByLabel("Expiry date").fill(expiry);
    await page.getByRole("button", { name: "Create service account" }).click();
    const tokenField = page.getByLabel("Token", { exact: true });
    await tokenField.waitFor();
    const token = await tokenField.inputValue();
    expect(await page.getByText("it is shown only once").count()).toBe(1);
    expect(await page.getByRole("button", { name: "Copy" }).count()).toBe(1);
    await page.getByRole("row", { name: /ci-staging/ }).waitFor();
    await screenshot(page, "03-api-keys-token-once");

    // The token shown is the account's token.
    const identity = await t.management(token).getIdentity({});
    expect(identity.kind).toBe("service_account");
    const row = page.getByRole("row", { name: /ci-staging/ });
    expect(await row.textContent()).toContain(identity.serviceAccountId);
    expect(await row.textContent()).toContain(expiry);

    // Leaving the page and coming back: the token is nowhere.
    await page.getByRole("link", { name: "Runs" }).click();
    await page.getByRole("heading", { name: "Runs" }).waitFor();
    await page.getByRole("link", { name: "API Keys" }).click();
    await page.getByRole("row", { name: /ci-staging/ }).waitFor();
    expect(await page.getByLabel("Token", { exact: true }).count()).toBe(0);
    expect(await page.content()).not.toContain(token);

    // Delete asks first; Cancel keeps it, confirming deletes it and its token.
    await page.getByRole("button", { name: "Delete service account ci-staging" }).click();
    const dialog = page.getByRole("dialog", { name: "Delete ci-staging?" });
    await dialog.waitFor();
    await screenshot(page, "04-api-keys-confirm-delete");
    await dialog.getByRole("button", { name: "Cancel" }).click();
    expect(await page.getByRole("row", { name: /ci-staging/ }).count()).toBe(1);
    await page.getByRole("button", { name: "Delete service account ci-staging" }).click();
    await page.getByRole("dialog").getByRole("button", { name: "Delete service account" }).click();
    await page.getByText("was deleted; its token no longer works").waitFor();
    expect(await page.getByRole("row", { name: /ci-staging/ }).count()).toBe(0);
    await page.reload();
    await page.getByRole("row", { name: /sa-dev/ }).waitFor();
    expect(await page.getByRole("row", { name: /ci-staging/ }).count()).toBe(0);
    await screenshot(page, "05-api-keys-after-delete");
    await expect(t.management(token).getIdentity({})).rejects.toSatisfy(
      (e) => ConnectError.from(e).code === Code.Unauthenticated,
    );
    expect(problems).toEqual([]);
  });

  it("an expired service account is marked expired", async () => {
    // The API refuses past expiries, so the expiry comes to pass: a 2-second account.
    const created = await t.management().createServiceAccount({
      projectId: P,
      name: "short-lived",
      expiresAt: { seconds: BigInt(Math.floor(Date.now() / 1000) + 2), nanos: 0 },
    });
    await new Promise((r) => setTimeout(r, 2500));
    await freshPage();
    await signIn(t.adminToken);
    await page.goto(`${t.url}/projects/${P}/keys`);
    const row = page.getByRole("row", { name: /short-lived/ });
    await row.waitFor();
    expect(await row.getByText("expired", { exact: true }).count()).toBe(1);
    expect(
      await page
        .getByRole("row", { name: /sa-dev/ })
        .getByText("expired", { exact: true })
        .count(),
    ).toBe(0);
    await t
      .management()
      .deleteServiceAccount({ projectId: P, serviceAccountId: created.serviceAccount!.serviceAccountId });
  });
});

describe("dashboard - runs", () => {
  it("an async run that failed appears live, marked async and failure; its page shows the timeline, the error and every webhook attempt, and Redeliver sends it again", async () => {
    await freshPage();
    await signIn(t.adminToken);
    await page.goto(`${t.url}/projects/${P}/runs?app=${APP}`);
    await page.getByText("Live", { exact: true }).waitFor();

    // Called while the page is open: the run must arrive without a reload.
    const accepted = await invoke("boom", { async: "true", webhookEndpoint: `${receiver.url}/hook` });
    expect(accepted.status).toBe(202);
    const runId = accepted.json.run_id!;
    const row = page.getByRole("row", { name: new RegExp(runId) });
    await row.getByText("failure").waitFor({ timeout: 60_000 });
    expect(await row.getByText("async", { exact: true }).count()).toBe(1);
    expect(await row.locator('[data-status="failure"]').count()).toBe(1);
    expect(await row.getByText("boom").count()).toBe(1);
    await receiver.waitFor("/hook", 2);
    await row.locator('[data-outcome="delivered"]').waitFor();
    await screenshot(page, "06-runs");

    // The filters: async only keeps it; status success hides it.
    await page.getByLabel("Async runs only").check();
    await page.waitForURL(/async=1/);
    await page.getByRole("row", { name: new RegExp(runId) }).waitFor();
    await page.getByLabel("Status").selectOption("success");
    await page.getByText("No runs match these filters.").waitFor();
    await page.getByLabel("Status").selectOption("failure");
    await page.getByRole("row", { name: new RegExp(runId) }).waitFor();

    await page.getByRole("link", { name: runId }).click();
    await page.getByRole("heading", { name: `Run ${runId}` }).waitFor();
    await page.getByRole("heading", { name: "Error" }).waitFor();
    expect(await page.getByText("the dial went past eleven").count()).toBe(1);
    const timeline = page.getByRole("list", { name: "Timeline" });
    for (const step of ["Queued", "Started", "Finished"]) expect(await timeline.getByText(step).count(), step).toBe(1);
    expect(await timeline.getByText("not yet").count()).toBe(0);

    const first = page.getByRole("region", { name: "Delivery 1" });
    await first.getByText("delivered").first().waitFor();
    const attempts = first.getByRole("row");
    expect(await attempts.count()).toBe(3); // header + 2 attempts
    expect(await attempts.nth(1).textContent()).toContain("HTTP 404");
    expect(await attempts.nth(1).locator('[data-outcome="retry"]').count()).toBe(1);
    expect(await attempts.nth(2).textContent()).toContain("HTTP 200");
    await screenshot(page, "07-run-webhook-attempts");

    await page.getByRole("button", { name: "Redeliver" }).click();
    await page.getByText("A fresh delivery has started").waitFor();
    const second = page.getByRole("region", { name: "Delivery 2" });
    await second.locator('[data-outcome="delivered"]').first().waitFor({ timeout: 60_000 });
    expect(receiver.to("/hook")).toHaveLength(3);
    await screenshot(page, "08-run-redelivered");
    expect(problems).toEqual([]);
  });

  it("when the live stream fails, the list says so and keeps up by polling", async () => {
    await freshPage();
    await page.route("**/skiff.management.v2.ManagementService/WatchRuns", (route) => route.abort("connectionrefused"));
    await signIn(t.adminToken);
    await page.goto(`${t.url}/projects/${P}/runs?app=${APP}`);
    await page.getByText(/Live updates are unavailable .*; refreshing every 3 s instead/).waitFor();
    const ok = await invoke("hello", { async: "true" }, { name: "Bo" });
    expect(ok.status).toBe(202);
    await page
      .getByRole("row", { name: new RegExp(ok.json.run_id!) })
      .getByText("success")
      .waitFor();
    // The refused stream itself is the one expected problem.
    expect(problems.filter((p) => !p.includes("WatchRuns") && !p.includes("ERR_CONNECTION_REFUSED"))).toEqual([]);
  });

  it("a project without apps says how to deploy one", async () => {
    await t.management().createProject({ projectId: "p-empty", name: "empty" });
    await freshPage();
    await signIn(t.adminToken);
    await page.goto(`${t.url}/projects/p-empty/runs`);
    await page.getByText("Project p-empty has no apps yet.").waitFor();
    expect(await page.getByText("npx skiff deploy").count()).toBe(1);
    await screenshot(page, "09-runs-empty");
  });
});

describe("dashboard - every app's runs, HTTP status, sync runs", () => {
  it("a project with several apps shows every app's runs by default, with an app column, listed and live; choosing an app narrows it", async () => {
    await deployWeb();
    // Runs from before the page opened come from ListRuns of every app...
    const before = {
      web: await call(WEB, "before", {}),
      demo: await invoke("hello", { async: "true" }, { name: "Al" }),
    };
    expect(before.web.status).toBe(200);
    expect(before.demo.status).toBe(202);
    await freshPage();
    await signIn(t.adminToken);
    await page.goto(`${t.url}/projects/${P}/runs`);
    await page.waitForURL(`**/projects/${P}/runs?app=-`);
    expect(await page.getByLabel("App", { exact: true }).inputValue()).toBe("-");
    expect(await page.getByLabel("App", { exact: true }).locator("option:checked").textContent()).toBe("All apps");
    await page.getByText("Live", { exact: true }).waitFor();
    const row = (runId: string) => page.getByRole("row", { name: new RegExp(runId) });
    await row(before.web.runId).waitFor();
    await row(before.demo.json.run_id!).waitFor();
    expect(await page.getByRole("columnheader", { name: "App", exact: true }).count()).toBe(1);
    expect(await row(before.web.runId).getByRole("cell", { name: WEB, exact: true }).count()).toBe(1);
    expect(await row(before.demo.json.run_id!).getByRole("cell", { name: APP, exact: true }).count()).toBe(1);

    // ...and runs of both apps arrive live.
    const refused = await call(WEB, "missing/thing", {});
    expect(refused.status).toBe(404);
    const later = await invoke("hello", { async: "true" }, { name: "Bea" });
    expect(later.status).toBe(202);
    await row(refused.runId).getByRole("cell", { name: WEB, exact: true }).waitFor();
    await row(later.json.run_id!).getByText("success").waitFor({ timeout: 60_000 });
    expect(await row(later.json.run_id!).getByRole("cell", { name: APP, exact: true }).count()).toBe(1);
    await screenshot(page, "11-runs-all-apps");

    // One app: only its runs, no app column.
    await page.getByLabel("App", { exact: true }).selectOption(WEB);
    await page.waitForURL(`**/projects/${P}/runs?app=${WEB}`);
    await row(refused.runId).waitFor();
    await row(before.web.runId).waitFor();
    expect(await row(later.json.run_id!).count()).toBe(0);
    expect(await page.getByRole("columnheader", { name: "App", exact: true }).count()).toBe(0);
    // All apps again, by choice.
    await page.getByLabel("App", { exact: true }).selectOption("All apps");
    await page.waitForURL(`**/projects/${P}/runs?app=-`);
    await row(later.json.run_id!).waitFor();
    expect(problems).toEqual([]);
  });

  it("a Custom app's 4xx answer shows its HTTP status beside the run's status, in amber, in the list and on the run's page", async () => {
    const refused = await call(WEB, "missing/page", {});
    expect(refused.status).toBe(404);
    const ok = await call(WEB, "fine", {});
    expect(ok.status).toBe(200);
    await freshPage();
    await signIn(t.adminToken);
    await page.goto(`${t.url}/projects/${P}/runs?app=${WEB}`);
    const refusedRow = page.getByRole("row", { name: new RegExp(refused.runId) });
    const okRow = page.getByRole("row", { name: new RegExp(ok.runId) });
    await refusedRow.locator('[data-http-status="404"]').waitFor();
    await okRow.locator('[data-http-status="200"]').waitFor();
    expect(await refusedRow.textContent()).toContain("HTTP status 404");

    // The run succeeded (the app answered), but the badge is no green success.
    const style = async (badge: Locator) => ({
      cls: (await badge.getAttribute("class")) ?? "",
      background: await computedStyle(badge, "backgroundColor"),
    });
    const refusedBadge = await style(refusedRow.locator('[data-status="success"]'));
    const okBadge = await style(okRow.locator('[data-status="success"]'));
    expect(refusedBadge.cls).toContain("status-warning");
    expect(refusedBadge.background).toBe("rgb(254, 243, 199)"); // amber
    expect(okBadge.cls).toContain("status-success");
    expect(okBadge.background).toBe("rgb(220, 252, 231)"); // green
    await screenshot(page, "12-runs-http-status");

    await refusedRow.getByRole("link", { name: refused.runId }).click();
    await page.getByRole("heading", { name: `Run ${refused.runId}` }).waitFor();
    const facts = page.locator("dl.facts");
    await facts.locator('[data-http-status="404"]').waitFor();
    expect((await style(facts.locator('[data-status="success"]'))).cls).toContain("status-warning");
    await page.getByText("The app answered HTTP 404").waitFor();
    await screenshot(page, "13-run-http-404");
    expect(problems).toEqual([]);
  });

  it("a sync run's page says the caller got the answer and skiff keeps no result; an async run's page shows its result", async () => {
    const sync = await invoke("hello", {}, { name: "Cy" });
    expect(sync.status).toBe(200);
    const queued = await invoke("hello", { async: "true" }, { name: "Di" });
    expect(queued.status).toBe(202);
    await freshPage();
    await signIn(t.adminToken);

    await page.goto(`${t.url}/projects/${P}/apps/${APP}/runs/${sync.runId}`);
    await page.getByRole("heading", { name: "Result" }).waitFor();
    const result = page.getByRole("region", { name: "Result" });
    expect(await result.textContent()).toContain("the caller got the answer");
    expect(await result.textContent()).toContain("skiff keeps no result of sync runs");
    expect(await result.textContent()).not.toContain("24 h");
    expect(await page.locator("dl.facts").getByText("sync", { exact: true }).count()).toBe(1);
    await screenshot(page, "14-run-sync");

    await page.goto(`${t.url}/projects/${P}/apps/${APP}/runs/${queued.json.run_id}`);
    await page.getByText("Hello, Di!").waitFor({ timeout: 60_000 });
    expect(await page.getByRole("region", { name: "Result" }).textContent()).not.toContain("sync runs");
    expect(problems).toEqual([]);
  });
});

describe("dashboard - apps", () => {
  it("shows runtime, deployment version, live replicas, scaling and the last hour's charts", async () => {
    const ok = await invoke("hello", {}, { name: "Ada" });
    expect(ok.status).toBe(200);
    await freshPage();
    await signIn(t.adminToken);
    await page.goto(`${t.url}/projects/${P}/apps`);
    const card = page.getByRole("article", { name: APP });
    await card.waitFor();
    expect(await card.getByText("Cortex, node").count()).toBe(1);
    expect(await card.textContent()).toMatch(/version 1 deployed/);
    expect(await card.textContent()).toContain("0–1 replicas");
    await card.getByRole("heading", { name: "Replicas (1)" }).waitFor();
    expect(await card.getByText("ready").count()).toBeGreaterThan(0);
    const runs = (await t.management().listRuns({ projectId: P, appName: APP, pageSize: 500 })).runs;
    const failed = runs.filter((r) => r.status === "failure").length;
    expect(failed).toBe(1);
    await card
      .getByRole("img", { name: `Runs per minute: ${runs.length} runs in the last hour, ${failed} failed` })
      .waitFor();
    await card.getByRole("img", { name: /Run time percentiles: worst p99/ }).waitFor();
    await screenshot(page, "10-apps");
    expect(problems).toEqual([]);
  });
});

describe("dashboard - on a phone (390 × 844)", () => {
  it("no button, input or select reaches past the window on the main pages, the page never scrolls sideways, and chart labels keep their size", async () => {
    const runs = (await t.management().listRuns({ projectId: P, appName: APP, pageSize: 500 })).runs;
    const failed = runs.find((r) => r.status === "failure" && r.webhookEndpoint !== "");
    expect(failed).toBeDefined();
    await freshPage("phone");
    const fits = async (name: string) => {
      await screenshot(page, `phone-${name}`);
      expect(await overflowsViewport(page), name).toEqual([]);
    };

    await page.goto(t.url + "/");
    await page.getByLabel("API token").waitFor();
    await fits("01-sign-in");
    await signIn(t.adminToken);
    await page.getByRole("heading", { name: "Projects" }).waitFor();
    await page.getByRole("listitem").filter({ hasText: P }).getByRole("link").waitFor();
    await fits("02-projects");

    await page.goto(`${t.url}/projects/${P}/runs?app=-`);
    const row = page.getByRole("row", { name: new RegExp(failed!.runId) });
    await row.waitFor();
    await fits("03-runs-all-apps");
    // A run's status reads without scrolling sideways: the table became one block per run.
    for (const part of [row.getByRole("link", { name: failed!.runId }), row.locator('[data-status="failure"]')]) {
      const box = (await part.boundingBox())!;
      expect(box.x).toBeGreaterThanOrEqual(0);
      expect(box.x + box.width).toBeLessThanOrEqual(390);
    }

    await page.goto(`${t.url}/projects/${P}/apps/${APP}/runs/${failed!.runId}`);
    await page.getByRole("region", { name: "Delivery 1" }).waitFor();
    await page.getByRole("button", { name: "Redeliver" }).waitFor();
    await fits("04-run");

    await page.goto(`${t.url}/projects/${P}/apps`);
    const card = page.getByRole("article", { name: APP });
    await card.getByRole("img", { name: /Runs per minute/ }).waitFor();
    await fits("05-apps");
    // An axis label is at least 12 px tall on the phone (a 600-unit chart squeezed to 340 px made them 7 px).
    await expect.poll(() => smallestTextHeight(page, ".chart svg text")).toBeGreaterThanOrEqual(12);

    await page.goto(`${t.url}/projects/${P}/keys`);
    await page.getByRole("row", { name: /sa-dev/ }).waitFor();
    await fits("06-api-keys");
    await page.getByLabel("Name").fill("phone-made");
    await page.getByRole("button", { name: "Create service account" }).click();
    await page.getByLabel("Token", { exact: true }).waitFor();
    await fits("07-api-keys-token-once");
    await page.getByRole("button", { name: "Delete service account phone-made" }).click();
    await page.getByRole("dialog", { name: "Delete phone-made?" }).waitFor();
    await fits("08-api-keys-confirm-delete");
    await page.getByRole("dialog").getByRole("button", { name: "Delete service account" }).click();
    await page.getByText("was deleted; its token no longer works").waitFor();
    expect(problems).toEqual([]);
  });
});

describe("dashboard - keyboard", () => {
  it("signs in and moves between sections with the keyboard alone, focus always visible", async () => {
    await freshPage();
    await page.goto(t.url + "/");
    await page.getByLabel("API token").waitFor();
    expect(await page.evaluate("document.activeElement?.id")).toBe("token"); // focused on arrival
    await page.keyboard.type(t.adminToken);
    await page.keyboard.press("Enter");
    await page.getByRole("button", { name: "Sign out" }).waitFor();
    await page.goto(`${t.url}/projects/${P}/runs?app=${APP}`);
    await page.getByRole("heading", { name: "Runs" }).waitFor();
    // Tab to the API Keys link and follow it.
    for (let i = 0; i < 12; i++) {
      await page.keyboard.press("Tab");
      const focused = await page.evaluate<{ text: string; outline: string }>(
        "({ text: document.activeElement.textContent, outline: getComputedStyle(document.activeElement).outlineStyle })",
      );
      expect(focused.outline, `focus on ${focused.text}`).not.toBe("none");
      if (focused.text === "API Keys") break;
    }
    await page.keyboard.press("Enter");
    await page.getByRole("heading", { name: "API Keys" }).waitFor();
    expect(problems).toEqual([]);
  });
});

/**
 * Places in the text of the elements `selector` matches where a line breaks
 * between two letters or digits of a word shorter than the element's line:
 * a word cut although it would fit on a line of its own.
 */
function midWordBreaks(page: Page, selector: string): Promise<string[]> {
  return page.evaluate<string[]>(`(() => {
    const problems = [];
    for (const el of document.querySelectorAll(${JSON.stringify(selector)})) {
      const node = el.firstChild;
      if (!node || node.nodeType !== 3 || el.getBoundingClientRect().width === 0) continue;
      const text = node.textContent;
      const lineWidth = el.parentElement.getBoundingClientRect().width;
      const top = (i) => { const r = document.createRange(); r.setStart(node, i); r.setEnd(node, i + 1); return r.getClientRects()[0]?.top; };
      for (const m of text.matchAll(/\\S+/g)) {
        const word = m[0];
        const r = document.createRange(); r.setStart(node, m.index); r.setEnd(node, m.index + word.length);
        if (r.getBoundingClientRect().width >= lineWidth) continue; // too long for any line: it must break
        for (let i = m.index; i < m.index + word.length - 1; i++) {
          if (/[A-Za-z0-9]/.test(text[i]) && /[A-Za-z0-9]/.test(text[i + 1]) && top(i) !== top(i + 1))
            problems.push(JSON.stringify(word) + " breaks after " + JSON.stringify(text.slice(m.index, i + 1)));
        }
      }
    }
    return problems;
  })()`);
}

/** Screenshots of these tests go to the test's own temporary folder. */
async function shot(name: string): Promise<void> {
  await page.screenshot({ path: path.join(tmp, "screenshots", `${name}.png`), fullPage: true });
}

describe("dashboard - layout at 1280 and 390 px", () => {
  it("the sign-in hint names the admin-token file of this skiff's data folder", async () => {
    for (const device of ["desktop", "phone"] as const) {
      await freshPage(device);
      await page.goto(t.url + "/");
      const hint = page.locator("#token-help");
      await hint.getByText(path.join(t.dataDir, "admin-token")).waitFor();
      expect(await hint.textContent()).not.toContain(".data/admin-token");
      await shot(`sign-in-${device}`);
      expect(await midWordBreaks(page, "#token-help code")).toEqual([]);
      await context.close();
    }
  });

  it("at 1280 px the all-apps runs table fits its frame: every column, Run time and Webhook included, is in view", async () => {
    if (t.skiff.runner!.version(P, WEB) === undefined) await deployWeb();
    await vi.waitUntil(() => t.skiff.runner!.version(P, WEB) !== undefined, { timeout: 60_000 });
    const long = await call(WEB, "some/long/path/of/a/custom/app", {
      webhookEndpoint: receiver.url + "/a-fairly-long-hook-path",
    });
    expect(long.status).toBe(200);
    expect(
      (await invoke("hello", { async: "true", webhookEndpoint: receiver.url + "/hook" }, { name: "W" })).status,
    ).toBe(202);
    // In the run history before the page opens.
    await vi.waitUntil(
      async () =>
        (await t.management().listRuns({ projectId: P, appName: WEB, pageSize: 50 })).runs.some(
          (r) => r.runId === long.runId,
        ),
      { timeout: 60_000, interval: 250 },
    );
    await freshPage();
    await signIn(t.adminToken);
    await page.goto(`${t.url}/projects/${P}/runs?app=-`);
    await page.getByRole("row", { name: new RegExp(long.runId) }).waitFor();
    await page.getByRole("columnheader", { name: "App", exact: true }).waitFor();
    await shot("runs-all-apps-1280");
    const layout = await page.evaluate<{
      table: number;
      frame: number;
      frameRight: number;
      headers: [string, number][];
    }>(
      `(() => {
        const frame = document.querySelector(".table-wrap");
        const table = frame.querySelector("table");
        return {
          table: table.getBoundingClientRect().width,
          frame: frame.clientWidth,
          frameRight: frame.getBoundingClientRect().right,
          headers: [...table.querySelectorAll("th")].map((th) => [th.textContent, th.getBoundingClientRect().right]),
        };
      })()`,
    );
    expect(layout.table).toBeLessThanOrEqual(layout.frame + 0.5);
    expect(layout.headers.map(([name]) => name)).toContain("Webhook");
    for (const [name, right] of layout.headers) expect(right, name).toBeLessThanOrEqual(layout.frameRight + 0.5);
    expect(problems).toEqual([]);
  });

  it("at 390 px code text breaks between words, never inside one", async () => {
    await freshPage("phone");
    await signIn(t.adminToken);
    const pages = [`/projects/${P}/apps`, `/projects/${P}/keys`];
    const runs = (await t.management().listRuns({ projectId: P, appName: APP, pageSize: 1 })).runs;
    if (runs[0]) pages.push(`/projects/${P}/apps/${APP}/runs/${runs[0].runId}`);
    for (const [i, where] of pages.entries()) {
      await page.goto(t.url + where);
      await page.locator("main h1").waitFor();
      await page.waitForLoadState("networkidle");
      await shot(`code-390-${i}`);
      expect(await midWordBreaks(page, "code"), where).toEqual([]);
    }
    // The page of a project without apps shows a long command in code.
    await t.management().createProject({ projectId: "p-bare", name: "Bare" });
    await page.goto(`${t.url}/projects/p-bare/runs`);
    await page.getByText("has no apps yet").waitFor();
    await shot("code-390-no-apps");
    expect(await midWordBreaks(page, "code")).toEqual([]);
  });

  it("the latency chart joins the minutes that have runs into one line per percentile, at 1280 and 390 px", async () => {
    // A skiff whose run history is on PostgreSQL, where runs of earlier minutes can be written as they would have been
    // recorded: minutes with runs, and minutes without any between them.
    const admin = new pg.Client({ host: "127.0.0.1", port: 5432, user: "postgres", database: "postgres" });
    await admin.connect();
    const database = `skiff_dash_${process.pid}_${Date.now()}`;
    await admin.query(`CREATE DATABASE ${database}`);
    let other: TestSkiff | undefined;
    try {
      other = await startTestSkiff({ env: { SKIFF_DATABASE_URL: `postgres://postgres@127.0.0.1:5432/${database}` } });
      const dir = await writeApp(tmp, {
        "skiff.toml": skiffToml({ name: "charted", runtime: { kind: "cortex", language: "node", entry: "index.mjs" } }),
        "index.mjs": "export const f = () => 1;",
      });
      await other
        .management()
        .deployApp({ projectId: P, bundle: { contentType: "application/gzip", data: (await packApp(dir)).bytes } });
      const db = new pg.Client({ host: "127.0.0.1", port: 5432, user: "postgres", database });
      await db.connect();
      const minute = Math.floor(Date.now() / 60_000) * 60_000;
      const measured = [-9, -7, -6, -3, -1];
      for (const [k, m] of measured.entries()) {
        for (let j = 0; j < 3; j++) {
          const at = minute + m * 60_000 + 1_000 * (j + 1);
          const hex = at.toString(16).padStart(12, "0");
          const id = `${hex.slice(0, 8)}-${hex.slice(8)}-7000-8000-${String(k * 10 + j).padStart(12, "0")}`;
          await db.query(
            `INSERT INTO skiff.runs (run_id, project_id, app_name, status, async, queued_at, started_at, finished_at, run_time_ms, status_code, record, revision)
             VALUES ($1, $2, 'charted', 'success', false, to_timestamp($3 / 1000.0), to_timestamp($3 / 1000.0), to_timestamp($3 / 1000.0), $4, 200, '{}', 1)`,
            [id, P, at, 5 + 10 * k + j],
          );
        }
      }
      await db.end();
      for (const device of ["desktop", "phone"] as const) {
        await freshPage(device);
        await page.goto(other.url + "/");
        await page.getByLabel("API token").fill(other.adminToken);
        await page.getByRole("button", { name: "Sign in" }).click();
        await page.getByRole("button", { name: "Sign out" }).waitFor();
        await page.goto(`${other.url}/projects/${P}/apps`);
        const chart = page.getByRole("article", { name: "charted" }).locator("figure.chart").nth(1);
        await chart.getByRole("img", { name: /worst p99/ }).waitFor();
        await chart.scrollIntoViewIfNeeded();
        await shot(`latency-${device}`);
        for (const series of ["p50", "p95", "p99"]) {
          const g = chart.locator(`.series.${series}`);
          expect(await g.locator("polyline").count(), series).toBe(1);
          const points = (await g.locator("polyline").getAttribute("points"))!.trim().split(/\s+/);
          expect(points, series).toHaveLength(measured.length);
          expect(await g.locator("circle").count(), series).toBe(measured.length);
          // The line stays inside the chart.
          const box = (await g.locator("polyline").boundingBox())!;
          const frame = (await chart.locator("svg").boundingBox())!;
          expect(box.x).toBeGreaterThanOrEqual(frame.x);
          expect(box.x + box.width).toBeLessThanOrEqual(frame.x + frame.width + 0.5);
        }
        expect(problems).toEqual([]);
        await context.close();
      }
    } finally {
      await other?.close();
      await admin.query(`DROP DATABASE IF EXISTS ${database} WITH (FORCE)`);
      await admin.end();
    }
  }, 120_000);

  it("the confirmation dialog dims and blocks the page behind it, at 1280 and 390 px", async () => {
    for (const device of ["desktop", "phone"] as const) {
      await freshPage(device);
      await signIn(t.adminToken);
      await page.goto(`${t.url}/projects/${P}/keys`);
      await page.getByLabel("Name").fill(`dim-${device}`);
      await page.getByRole("button", { name: "Create service account" }).click();
      await page.getByLabel("Token", { exact: true }).waitFor();
      await page.getByRole("button", { name: `Delete service account dim-${device}` }).click();
      const dialog = page.getByRole("dialog", { name: `Delete dim-${device}?` });
      await dialog.waitFor();
      await shot(`confirm-${device}`);
      const backdrop = await dialog.evaluate(
        (el) =>
          (
            globalThis as unknown as { getComputedStyle(e: unknown, p: string): Record<string, string> }
          ).getComputedStyle(el, "::backdrop").backgroundColor,
      );
      const alpha = Number(/rgba\([^)]*,\s*([\d.]+)\)/.exec(backdrop)?.[1] ?? (backdrop.startsWith("rgb(") ? 1 : 0));
      expect(alpha, backdrop).toBeGreaterThanOrEqual(0.3);
      // What is behind cannot be clicked: the topmost element at the page's corner is the backdrop (the dialog's).
      const corner = await page.evaluate<string>(
        `(() => { const el = document.elementFromPoint(2, 2); return el ? el.tagName : "none"; })()`,
      );
      expect(corner).toBe("DIALOG");
      await dialog.getByRole("button", { name: "Cancel" }).click();
      await context.close();
    }
  });
});

/** Secret values the Secrets page must never show. Its tests come last: they leave a secret in P. */
const SECRET_VALUE = "dash-secret-value-5e0a91c3";
const SECRET_VALUE2 = "dash-secret-value-second-77b2";

describe("dashboard - secrets", () => {
  it("sets a secret shown by name and times only, replaces its value, shows a refusal, deletes it after asking", async () => {
    await freshPage();
    await signIn(t.devToken);
    await page.getByRole("link", { name: "Secrets" }).click();
    await page.getByRole("heading", { name: "Secrets", exact: true }).waitFor();
    await page.getByText("No secrets yet.").waitFor();

    await page.getByLabel("Name", { exact: true }).fill("HF_AUTH_TOKEN");
    await page.getByLabel("Value", { exact: true }).fill(SECRET_VALUE);
    await page.getByRole("button", { name: "Save secret" }).click();
    await page.getByText("Secret HF_AUTH_TOKEN was created").waitFor();
    const row = page.getByRole("row", { name: /HF_AUTH_TOKEN/ });
    await row.waitFor();
    expect(await page.getByLabel("Value", { exact: true }).inputValue()).toBe("");
    expect(await page.content()).not.toContain(SECRET_VALUE);
    await screenshot(page, "secrets-01-created");
    const listed = await t.management().listSecrets({ projectId: P });
    expect(listed.secrets.map((s) => s.name)).toEqual(["HF_AUTH_TOKEN"]);

    // Replace value: the form takes the name; the new value is saved over the old.
    await page.getByRole("button", { name: "Replace the value of HF_AUTH_TOKEN" }).click();
    expect(await page.getByLabel("Name", { exact: true }).inputValue()).toBe("HF_AUTH_TOKEN");
    await page.getByLabel("Value", { exact: true }).fill(SECRET_VALUE2);
    await page.getByRole("button", { name: "Save secret" }).click();
    await page.getByText("Secret HF_AUTH_TOKEN was updated").waitFor();
    expect(await page.getByRole("row", { name: /HF_AUTH_TOKEN/ }).count()).toBe(1);

    // A name skiff keeps for itself: the server's reason is shown, nothing is listed.
    await page.getByLabel("Name", { exact: true }).fill("PORT");
    await page.getByLabel("Value", { exact: true }).fill("80");
    await page.getByRole("button", { name: "Save secret" }).click();
    await page.getByText(/name is set by skiff itself/).waitFor();
    expect(await page.getByRole("row", { name: /PORT/ }).count()).toBe(0);

    // After a reload the value is nowhere on the page.
    await page.reload();
    await page.getByRole("row", { name: /HF_AUTH_TOKEN/ }).waitFor();
    const html = await page.content();
    expect(html).not.toContain(SECRET_VALUE);
    expect(html).not.toContain(SECRET_VALUE2);

    // Delete asks first; Cancel keeps it, confirming deletes it.
    await page.getByRole("button", { name: "Delete secret HF_AUTH_TOKEN" }).click();
    const dialog = page.getByRole("dialog", { name: "Delete HF_AUTH_TOKEN?" });
    await dialog.waitFor();
    await screenshot(page, "secrets-02-confirm-delete");
    await dialog.getByRole("button", { name: "Cancel" }).click();
    expect(await page.getByRole("row", { name: /HF_AUTH_TOKEN/ }).count()).toBe(1);
    await page.getByRole("button", { name: "Delete secret HF_AUTH_TOKEN" }).click();
    await page.getByRole("dialog").getByRole("button", { name: "Delete secret" }).click();
    await page.getByText("Secret HF_AUTH_TOKEN was deleted").waitFor();
    expect(await page.getByRole("row", { name: /HF_AUTH_TOKEN/ }).count()).toBe(0);
    expect((await t.management().listSecrets({ projectId: P })).secrets).toEqual([]);
    // The one problem is the refusal of PORT, which the browser reports as a failed load.
    expect(problems).toEqual([
      "console: Failed to load resource: the server responded with a status of 400 (Bad Request)",
    ]);
  });

  it("on a phone nothing reaches past the window, with a secret listed and in the confirmation", async () => {
    await t.management().setSecret({ projectId: P, name: "A_RATHER_LONG_SECRET_NAME_FOR_A_PHONE", value: "v" });
    await freshPage("phone");
    await signIn(t.devToken);
    await page.goto(`${t.url}/projects/${P}/secrets`);
    await page.getByRole("row", { name: /A_RATHER_LONG_SECRET_NAME_FOR_A_PHONE/ }).waitFor();
    await screenshot(page, "phone-secrets");
    expect(await overflowsViewport(page)).toEqual([]);
    await page.getByRole("button", { name: "Delete secret A_RATHER_LONG_SECRET_NAME_FOR_A_PHONE" }).click();
    await page.getByRole("dialog").waitFor();
    expect(await overflowsViewport(page)).toEqual([]);
    expect(problems).toEqual([]);
  });
});
