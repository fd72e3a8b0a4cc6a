// Leases on the fixed `port` of Custom apps (services/runner/ports.ts): a
// sandboxed replica has a network namespace of its own, so apps of different
// projects with the same port run side by side; without the sandbox they
// share this machine's ports, and the app that finds the port taken is told
// only that it is in use here, never which project or app holds it.
import { describe, expect, it } from "vitest";
import { StartFailed } from "../../services/runs/index.js";
import { PortLeases } from "../../services/runner/ports.js";

const A = "p-alpha/billing";
const B = "p-beta/shop";

describe("PortLeases", () => {
  it("sandboxed: apps of different projects with the same port start side by side", async () => {
    const ports = new PortLeases();
    const first = await ports.acquire(8080, A, { sandboxed: true });
    const second = await ports.acquire(8080, B, { sandboxed: true });
    // The next version of the same app does not wait for the first either.
    const next = await ports.acquire(8080, A, { sandboxed: true });
    for (const release of [first, second, next]) release();
    // Nothing was leased: an unsandboxed replica finds the port free.
    (await ports.acquire(8080, B))();
  });

  it("unsandboxed: another app is refused, with no word of the project or app that holds the port", async () => {
    const ports = new PortLeases();
    const release = await ports.acquire(8080, A, { sandboxed: false });
    const refused = await ports.acquire(8080, B).catch((e: unknown) => e);
    expect(refused).toBeInstanceOf(StartFailed);
    expect((refused as Error).message).toBe("port 8080 is in use on this machine");
    for (const word of ["p-alpha", "billing", "alpha"]) expect((refused as Error).message).not.toContain(word);
    // Another port is another lease.
    (await ports.acquire(8081, B))();
    release();
    (await ports.acquire(8080, B))();
  });

  it("unsandboxed: the next version of the same app waits for the lease, then takes it", async () => {
    const ports = new PortLeases();
    const events: string[] = [];
    const release = await ports.acquire(8080, A);
    const next = ports.acquire(8080, A).then((r) => {
      events.push("next acquired");
      return r;
    });
    await new Promise((r) => setImmediate(r));
    expect(events).toEqual([]);
    events.push("released");
    release();
    const releaseNext = await next;
    expect(events).toEqual(["released", "next acquired"]);
    // The new version holds it now: another app is still refused.
    await expect(ports.acquire(8080, B)).rejects.toThrow("port 8080 is in use on this machine");
    releaseNext();
  });
});
