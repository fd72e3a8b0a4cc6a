// Sandbox uids from KV `skiff-uids` (runner/uids.ts) against a real
// nats-server provisioned as skiff provisions it: one uid per project, the
// same in every process, never given twice (not after a project's key is
// deleted, not to a build), and refusals for a key that is not one.
import { connect, type KV, type NatsConnection } from "nats";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { buckets } from "../../services/nats/layout.js";
import { buildUid } from "../../services/runner/sandbox-argv.js";
import { FIRST_UID, hashedUids, UID_LIMIT, UidRegistry } from "../../services/runner/uids.js";
import { startProvisionedNats, type TestNats } from "../helpers/nats-server.js";

let nats: TestNats;
let stop: () => Promise<void>;
/** Two connections, as two skiff processes have. */
let one: NatsConnection;
let two: NatsConnection;
let kv: KV;

beforeAll(async () => {
  ({ nats, nc: one, stop } = await startProvisionedNats());
  two = await connect({ servers: nats.url });
  kv = await one.jetstream().views.kv(buckets.uids.name, { bindOnly: true });
});
afterAll(async () => {
  await two?.close();
  await stop?.();
});

const uidIn = async (key: string) => Number(new TextDecoder().decode((await kv.get(key))!.value));

describe("sandbox uids from the registry", () => {
  it("gives two projects whose hashed uids collide a uid each", async () => {
    // The hash of both ids lands on one uid: why uids come from a registry.
    expect(await hashedUids.projectUid("p-team354")).toBe(await hashedUids.projectUid("p-team1585"));
    const uids = await UidRegistry.open(one);
    const a = await uids.projectUid("p-team354");
    const b = await uids.projectUid("p-team1585");
    expect(a).not.toBe(b);
    for (const uid of [a, b]) expect(uid).toBeGreaterThanOrEqual(FIRST_UID);
    for (const uid of [a, b]) expect(uid).toBeLessThan(UID_LIMIT);
    expect(await uidIn("project.p-team354")).toBe(a);
    expect(await uidIn("project.p-team1585")).toBe(b);
  });

  it("gives one project the same uid in two processes allocating at the same time", async () => {
    const [first, second] = [await UidRegistry.open(one), await UidRegistry.open(two)];
    for (let i = 0; i < 20; i++) {
      const project = `p-race${i}`;
      const answers = await Promise.all([
        first.projectUid(project),
        second.projectUid(project),
        first.projectUid(project),
        second.projectUid(project),
      ]);
      expect(new Set(answers).size).toBe(1);
      expect(await uidIn(`project.${project}`)).toBe(answers[0]);
    }
    // A third process, later, reads the same answers.
    const third = await UidRegistry.open(two);
    expect(await third.projectUid("p-race7")).toBe(await first.projectUid("p-race7"));
  });

  it("gives many projects allocated at once from several processes as many different uids", async () => {
    const registries = await Promise.all([one, two, one, two].map((nc) => UidRegistry.open(nc)));
    const projects = Array.from({ length: 40 }, (_, i) => `p-many${i}`);
    const answers = await Promise.all(
      projects.flatMap((project) => registries.map((uids) => uids.projectUid(project).then((uid) => [project, uid]))),
    );
    const byProject = new Map<string, Set<number>>();
    for (const [project, uid] of answers as [string, number][])
      byProject.set(project, (byProject.get(project) ?? new Set()).add(uid));
    for (const seen of byProject.values()) expect(seen.size).toBe(1);
    const uids = [...byProject.values()].map((seen) => [...seen][0]);
    expect(new Set(uids).size).toBe(projects.length);
  });

  it("never gives a deleted project's uid to another project", async () => {
    const uids = await UidRegistry.open(one);
    const gone = await uids.projectUid("p-gone");
    await kv.delete("project.p-gone");
    const other = await (await UidRegistry.open(two)).projectUid("p-after");
    expect(other).not.toBe(gone);
    expect(other).toBeGreaterThan(gone);
    // Nor to the deleted project itself, when asked again by a process that never knew it.
    const again = await (await UidRegistry.open(two)).projectUid("p-gone");
    expect(again).not.toBe(gone);
    expect(again).not.toBe(other);
    await kv.purge("project.p-after");
    const afterPurge = await (await UidRegistry.open(one)).projectUid("p-after-purge");
    expect([gone, other, again]).not.toContain(afterPurge);
  });

  it("gives projects uids below the range builds run as", async () => {
    const [first, second] = [await UidRegistry.open(one), await UidRegistry.open(two)];
    const projects = Array.from({ length: 10 }, (_, i) => `p-build${i}`);
    const results = await Promise.all(projects.map((project, i) => (i % 2 ? first : second).projectUid(project)));
    expect(new Set(results).size).toBe(results.length);
    for (const uid of results) expect(uid).toBeLessThan(UID_LIMIT);
    for (const key of ["/a.build", "/b.build", "/c.build"]) expect(buildUid(key)).toBeGreaterThanOrEqual(UID_LIMIT);
    // The counter moved past every uid given out.
    expect(await uidIn("next")).toBeGreaterThan(Math.max(...results));
  });

  it("refuses a project id that is not one token of a KV key", async () => {
    const uids = await UidRegistry.open(one);
    for (const bad of ["", "p.a", "p-a.b", "p*", "p>", "p a", "p/a", "../p", "p\n", "p-" + "x".repeat(200)])
      await expect(uids.projectUid(bad)).rejects.toThrow(/not a valid project id/);
  });

  it("refuses with a clear error once every uid below UID_LIMIT is given out", async () => {
    const entry = await kv.get("next");
    await kv.put("next", String(UID_LIMIT - 1));
    try {
      const uids = await UidRegistry.open(one);
      expect(await uids.projectUid("p-last")).toBe(UID_LIMIT - 1);
      await expect(uids.projectUid("p-toolate")).rejects.toThrow(/no sandbox uid left/);
      expect(await kv.get("project.p-toolate")).toBeNull();
    } finally {
      await kv.put("next", entry!.value);
    }
  });

  it("refuses to number uids again when the counter was deleted", async () => {
    const entry = await kv.get("next");
    await kv.delete("next");
    try {
      const uids = await UidRegistry.open(one);
      await expect(uids.projectUid("p-nocounter")).rejects.toThrow(/cannot get the sandbox uid of project p-nocounter/);
    } finally {
      await kv.put("next", entry!.value);
    }
  });
});
