// The sign-in page's hint (`/sign-in-hint.json`) names the admin token's file
// only to a browser on skiff's own machine. A loopback peer does not tell
// that: a page of any web site gets a browser on the machine to connect to
// 127.0.0.1 by pointing a name of its own there (DNS rebinding) and fetching
// the hint from its own origin, with its own name in Host; the answer is
// then same-origin to that page, which would read the file's path (the data
// folder, often in a user's home). The Host must name the loopback as well.
import http from "node:http";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { startTestSkiff, type TestSkiff } from "../helpers/skiff.js";

let s: TestSkiff;

beforeAll(async () => {
  s = await startTestSkiff();
}, 60_000);

afterAll(async () => {
  await s?.close();
});

/** GET /sign-in-hint.json from 127.0.0.1 with the given Host header. */
function hint(host: string): Promise<{ status: number; body: Record<string, unknown> }> {
  return new Promise((resolve, reject) => {
    const req = http.request(
      { host: "127.0.0.1", port: s.skiff.port, path: "/sign-in-hint.json", headers: { host }, setHost: false },
      (res) => {
        let text = "";
        res.on("data", (d: Buffer) => (text += d.toString()));
        res.on("end", () =>
          resolve({ status: res.statusCode ?? 0, body: JSON.parse(text) as Record<string, unknown> }),
        );
      },
    );
    req.on("error", reject);
    req.end();
  });
}

describe("the admin token's path in the sign-in hint", () => {
  it("is told to a browser on this machine", async () => {
    for (const host of [`127.0.0.1:${s.skiff.port}`, `localhost:${s.skiff.port}`, `[::1]:${s.skiff.port}`]) {
      const { status, body } = await hint(host);
      expect(status, host).toBe(200);
      expect(body, host).toMatchObject({ adminToken: "file", file: `${s.dataDir}/admin-token` });
    }
  });

  it("is not told to a page of another site rebound to 127.0.0.1", async () => {
    for (const host of [
      `rebind.attacker.example:${s.skiff.port}`,
      "rebind.attacker.example",
      `127.0.0.1.nip.io:${s.skiff.port}`,
    ]) {
      const { status, body } = await hint(host);
      expect(status, host).toBe(200);
      expect(body, host).toEqual({ adminToken: "file" });
    }
  });
});
