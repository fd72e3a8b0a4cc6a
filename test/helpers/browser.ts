// Browser tests: the dashboard built once (and again when its sources
// change), Debian's chromium driven by playwright-core, screenshots in
// test-results/screenshots/, and every console error or failed page load
// collected so that a test can insist there were none.
import { execFile } from "node:child_process";
import { mkdir, readdir, rename, rm, stat } from "node:fs/promises";
import path from "node:path";
import { promisify } from "node:util";
import { chromium, type Browser, type Locator, type Page } from "playwright-core";

const run = promisify(execFile);
const ROOT = path.resolve(import.meta.dirname, "../..");
export const DASHBOARD_DIR = path.join(ROOT, "services", "dashboard");
const DIST = path.join(DASHBOARD_DIR, "dist");
const SOURCES = [
  DASHBOARD_DIR,
  path.join(DASHBOARD_DIR, "public"),
  path.join(ROOT, "gen", "skiff", "management", "v2"),
];
export const SCREENSHOTS = path.join(ROOT, "test-results", "screenshots");
export const CHROMIUM = "/usr/bin/chromium";

async function newestSource(): Promise<number> {
  let newest = 0;
  for (const dir of SOURCES) {
    for (const e of await readdir(dir, { withFileTypes: true })) {
      if (e.isFile()) newest = Math.max(newest, (await stat(path.join(dir, e.name))).mtimeMs);
    }
  }
  return newest;
}

/**
 * Builds the dashboard unless dist/ is newer than every source. The build
 * goes to a folder of its own and is renamed into place, so test files that
 * build at the same time never see half a build.
 */
export async function ensureDashboardBuilt(): Promise<void> {
  const built = await stat(path.join(DIST, "index.html")).then(
    (s) => s.mtimeMs,
    () => 0,
  );
  if (built > (await newestSource())) return;
  const out = path.join(DASHBOARD_DIR, `dist.tmp-${process.pid}`);
  try {
    await run(
      process.execPath,
      [
        path.join(ROOT, "node_modules", "vite", "bin", "vite.js"),
        "build",
        DASHBOARD_DIR,
        "--outDir",
        out,
        "--emptyOutDir",
        "--logLevel",
        "error",
      ],
      { cwd: ROOT },
    );
    await rm(DIST, { recursive: true, force: true });
    // Another test file may have put its build there meanwhile: theirs is as good.
    await rename(out, DIST).catch(() => undefined);
  } finally {
    await rm(out, { recursive: true, force: true });
  }
}

export function launchChromium(): Promise<Browser> {
  return chromium.launch({
    executablePath: CHROMIUM,
    headless: true,
    args: [
      "--no-sandbox",
      "--disable-gpu",
      "--disable-background-networking",
      "--disable-component-update",
      "--no-first-run",
      "--disable-sync",
    ],
  });
}

/** Console errors, uncaught exceptions and failed requests of a page (CSP violations are console errors). */
export function collectProblems(page: Page): string[] {
  const problems: string[] = [];
  page.on("console", (m) => {
    if (m.type() === "error") problems.push(`console: ${m.text()}`);
  });
  page.on("pageerror", (e) => problems.push(`exception: ${e.message}`));
  page.on("requestfailed", (r) => {
    // A stream or poll cut short by navigation is not a problem.
    if (r.failure()?.errorText !== "net::ERR_ABORTED")
      problems.push(`request failed: ${r.url()} ${r.failure()?.errorText}`);
  });
  return problems;
}

export async function screenshot(page: Page, name: string): Promise<string> {
  await mkdir(SCREENSHOTS, { recursive: true });
  const file = path.join(SCREENSHOTS, `${name}.png`);
  await page.screenshot({ path: file, fullPage: true });
  return file;
}

/**
 * What does not fit a narrow window: the page itself scrolling sideways, and
 * every shown button, input, select or text area that reaches past the
 * window's left or right edge (clipped, or only reachable by scrolling the
 * whole page). One line per problem; none when everything fits.
 */
export function overflowsViewport(page: Page): Promise<string[]> {
  // A string, so the tests type-check without the DOM library.
  return page.evaluate<string[]>(`(() => {
    const width = document.documentElement.clientWidth;
    const problems = [];
    const pageWidth = document.documentElement.scrollWidth;
    if (pageWidth > width) problems.push("the page is " + pageWidth + " px wide in a " + width + " px window");
    for (const el of document.querySelectorAll("button, input, select, textarea")) {
      const r = el.getBoundingClientRect();
      if (r.width === 0 && r.height === 0) continue; // not shown
      if (r.left < -0.5 || r.right > width + 0.5) {
        const name = (el.getAttribute("aria-label") || el.textContent || el.id || el.getAttribute("name") || "").trim();
        problems.push(el.tagName.toLowerCase() + " \\"" + name.slice(0, 40) + "\\" spans " + Math.round(r.left) + ".." + Math.round(r.right) + " px");
      }
    }
    return problems;
  })()`);
}

/** The smallest rendered height in CSS pixels of the text elements `selector` matches (Infinity when none). */
export function smallestTextHeight(page: Page, selector: string): Promise<number> {
  return page.evaluate<number>(
    `Math.min(...[...document.querySelectorAll(${JSON.stringify(selector)})].map((e) => e.getBoundingClientRect().height))`,
  );
}

/** A CSS property of the element `locator` names, as the browser computed it (colours as rgb(…)). */
export function computedStyle(locator: Locator, property: string): Promise<string> {
  // Runs in the page, where getComputedStyle exists; the tests are typed without the DOM library.
  type Window = { getComputedStyle(el: unknown): Record<string, string> };
  return locator.evaluate((el, prop) => (globalThis as unknown as Window).getComputedStyle(el)[prop], property);
}
