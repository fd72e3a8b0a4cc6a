// Browser tests: the dashboard built once (and again when its sources
// change), Debian's chromium driven by playwright-core, screenshots in
// test-results/screenshots/, and every console error or failed page load
// collected so that a test can insist there were none.
import { execFile } from "node:child_process";
import { mkdir, readdir, rename, rm, stat } from "node:fs/promises";
import path from "node:path";
import { promisify } from "node:util";
import { chromium, type Browser, type Page } from "playwright-core";

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
