// The reporter that ends a stuck test run: it waits while things end, says
// what is in flight once nothing has for the stall time, and ends the run once.
import { describe, expect, it } from "vitest";
import type { ReportedHookContext, TestCase, TestModule } from "vitest/node";
import StallWatch from "./stall-watch.js";

const MINUTE = 60_000;

function watch() {
  let now = 0;
  const out: string[] = [];
  let ended = 0;
  const w = new StallWatch({
    stallMs: 10 * MINUTE,
    now: () => now,
    write: (t) => out.push(t),
    end: () => ended++,
    processes: () => "(processes)",
    intervalMs: 0,
  });
  return { w, out, ended: () => ended, at: (m: number) => (now = m * MINUTE) };
}

const file = (name: string) =>
  ({
    type: "module",
    moduleId: `/x/${name}`,
    relativeModuleId: name,
    project: { name: "integration" },
  }) as unknown as TestModule;
const test = (id: string, name: string, module: TestModule) =>
  ({ type: "test", id, fullName: name, module }) as unknown as TestCase;

describe("StallWatch", () => {
  it("waits while something ends within the stall time, however long the run", () => {
    const { w, out, ended, at } = watch();
    const a = file("a.test.ts");
    w.onTestModuleStart(a);
    for (let m = 1; m <= 60; m++) {
      at(m * 9);
      const t = test(`t${m}`, `case ${m}`, a);
      w.onTestCaseReady(t);
      w.onTestCaseResult(t);
      expect(w.check()).toBe(false);
    }
    expect(out).toEqual([]);
    expect(ended()).toBe(0);
  });

  it("does nothing before the run starts (the bundles being made) and after it ends", () => {
    const { w, ended, at } = watch();
    at(30);
    expect(w.check()).toBe(false);
    w.onTestRunStart();
    const a = file("a.test.ts");
    w.onTestModuleStart(a);
    w.onTestModuleEnd(a);
    w.onTestRunEnd();
    at(60);
    expect(w.check()).toBe(false);
    expect(ended()).toBe(0);
  });

  it("ends a run whose files have all ended but which itself does not end", () => {
    const { w, out, ended, at } = watch();
    w.onTestRunStart();
    const a = file("a.test.ts");
    w.onTestModuleStart(a);
    at(1);
    w.onTestModuleEnd(a);
    at(10.9);
    expect(w.check()).toBe(false);
    at(11);
    expect(w.check()).toBe(true);
    expect(ended()).toBe(1);
    expect(out.join("")).toContain("nothing: every file has ended, the run has not");
  });

  it("reports what is in flight, the longest first, and ends the run once nothing has started or ended for the stall time", () => {
    const { w, out, ended, at } = watch();
    const a = file("a.test.ts");
    const b = file("b.test.ts");
    w.onTestModuleStart(a);
    at(1);
    w.onTestModuleStart(b);
    const stuck = test("b1", "waits > forever", b);
    w.onTestCaseReady(stuck);
    at(2);
    w.onHookStart({ name: "afterAll", entity: a } as ReportedHookContext);
    at(11.9);
    expect(w.check()).toBe(false);
    at(12);
    expect(w.check()).toBe(true);
    expect(ended()).toBe(1);
    const report = out.join("");
    expect(report).toContain("nothing has started or ended for 10.0 minutes");
    const order = [
      "integration a.test.ts",
      "integration b.test.ts",
      'test "waits > forever" (b.test.ts)',
      "afterAll of a.test.ts",
    ];
    const at720 = order.map((s) => report.indexOf(s));
    expect(at720.every((i) => i >= 0)).toBe(true);
    expect([...at720].sort((x, y) => x - y)).toEqual(at720);
    expect(report).toContain("720 s: integration a.test.ts");
    expect(report).toContain("(processes)");
  });

  it("counts a hook's start and its end as the run moving", () => {
    const { w, ended, at } = watch();
    const a = file("a.test.ts");
    w.onTestModuleStart(a);
    const hook = { name: "beforeAll", entity: a } as ReportedHookContext;
    at(5);
    w.onHookStart(hook);
    at(14);
    expect(w.check()).toBe(false);
    w.onHookEnd(hook);
    at(23);
    expect(w.check()).toBe(false);
    expect(ended()).toBe(0);
    at(24);
    expect(w.check()).toBe(true);
    expect(ended()).toBe(1);
  });
});
