// The dashboard in a real browser (Debian's chromium through playwright-core)
// against a real skiff: sign in, API keys with the token shown once, an async
// run that failed marked `async` and `failure` live, its webhook attempts and
// a redelivery, and the apps page. Each page's screenshot goes to
// test-results/screenshots/.
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { Code, ConnectError } from "@connectrpc/connect";
import type { Browser, BrowserContext, Page } from "playwright-core";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { packApp } from "../services/apps/bundle.js";
import { skiffToml, writeApp } from "./helpers/apps.js";
import { collectProblems, ensureDashboardBuilt, launchChromium, screenshot } from "./helpers/browser.js";
import { startTestSkiff, type TestSkiff } from "./helpers/skiff.js";
import { startReceiver, type Receiver } from "./helpers/webhook-receiver.js";

const P = "p-dev";
const APP = "dash-demo";
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

async function invoke(
  fn: string,
  query: Record<string, string>,
  body: unknown = {},
): Promise<{ status: number; json: { run_id?: string } }> {
  const res = await fetch(`${t.url}/v4/${P}/${APP}/${fn}?${new URLSearchParams(query)}`, {
    method: "POST",
    headers: { authorization: `Bearer ${t.adminToken}`, "content-type": "application/json" },
    body: JSON.stringify(body),
  });
  return { status: res.status, json: (await res.json()) as { run_id?: string } };
}

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

async function freshPage(): Promise<void> {
  context = await browser.newContext({ viewport: { width: 1280, height: 860 } });
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
  it("a wrong token is refused with what to do; the admin token signs in, picks a project, and the session survives a reload until sign out", async () => {
    await freshPage();
    await page.goto(t.url + "/");
    await screenshot(page, "01-sign-in");
    await page.getByLabel("API token").fill("not-a-token");
    await page.getByRole("button", { name: "Sign in" }).click();
    await expect.poll(() => page.getByRole("alert").textContent()).toContain("refused the token");

    await page.getByLabel("API token").fill(t.adminToken);
    await page.getByRole("button", { name: "Sign in" }).click();
    await page.getByRole("heading", { name: "Projects" }).waitFor();
    const project = page.getByRole("listitem").filter({ hasText: P }).getByRole("link");
    await project.waitFor();
    await screenshot(page, "02-projects");
    expect(await page.getByText("Signed in as admin").count()).toBe(1);

    await project.click();
    await page.waitForURL(`**/projects/${P}/runs?app=${APP}`);
    await page.reload();
    await page.getByRole("heading", { name: "Runs" }).waitFor();
    expect(await page.evaluate(TOKEN_IN_SESSION)).toBe(t.adminToken);

    await page.getByRole("button", { name: "Sign out" }).click();
    await page.getByLabel("API token").waitFor();
    expect(await page.evaluate(TOKEN_IN_SESSION)).toBeNull();
    expect(problems.filter((p) => !p.includes("401"))).toEqual([]);
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
    await row.getByText("failure").waitFor({ timeout: 20_000 });
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
    await second.locator('[data-outcome="delivered"]').first().waitFor({ timeout: 20_000 });
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

describe("dashboard - keyboard", () => {
  it("signs in and moves between sections with the keyboard alone, focus always visible", async () => {
    await freshPage();
    await page.goto(t.url + "/");
    await page.getByLabel("API token").waitFor();
    expect(await page.evaluate("document.activeElement?.id")).toBe("token"); // focused on arrival
    await page.keyboard.type(t.adminToken);
    await page.keyboard.press("Enter");
    await page.getByRole("heading", { name: "Projects" }).waitFor();
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
