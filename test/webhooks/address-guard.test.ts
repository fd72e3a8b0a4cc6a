import http from "node:http";
import { describe, expect, it } from "vitest";
import { parseCidr } from "../../services/config/index.js";
import { AddressGuard, BlockedAddressError } from "../../services/webhooks/address-guard.js";

describe("webhook address guard", () => {
  const guard = new AddressGuard();

  it.each([
    "127.0.0.1",
    "127.9.9.9",
    "10.1.2.3",
    "172.16.0.1",
    "172.31.255.255",
    "192.168.1.1",
    "169.254.169.254",
    "100.64.0.1",
    "224.0.0.1",
    "255.255.255.255",
    "0.0.0.0",
    "::1",
    "::",
    "fe80::1",
    "fd00:ec2::254",
    "fc00::1",
    "ff02::1",
    "::ffff:127.0.0.1",
    "::ffff:a9fe:a9fe",
    "64:ff9b::a9fe:a9fe",
  ])("refuses %s by default", (address) => {
    expect(guard.isBlocked(address)).toBe(true);
  });

  it.each(["93.184.216.34", "1.1.1.1", "172.32.0.1", "100.128.0.1", "2606:4700:4700::1111", "::ffff:8.8.8.8"])(
    "lets %s through",
    (address) => {
      expect(guard.isBlocked(address)).toBe(false);
    },
  );

  it("SKIFF_WEBHOOK_ALLOWED_CIDRS ranges are exempt, and only they", () => {
    const local = new AddressGuard(["127.0.0.0/8", "::1/128"]);
    expect(local.isBlocked("127.0.0.1")).toBe(false);
    expect(local.isBlocked("::1")).toBe(false);
    expect(local.isBlocked("::ffff:127.0.0.1")).toBe(false);
    expect(local.isBlocked("10.0.0.1")).toBe(true);
  });

  it("check() resolves names: localhost is refused, an IP literal in brackets too", async () => {
    await expect(guard.check("localhost")).rejects.toBeInstanceOf(BlockedAddressError);
    await expect(guard.check("[::1]")).rejects.toBeInstanceOf(BlockedAddressError);
    await expect(new AddressGuard(["127.0.0.0/8", "::1/128"]).check("localhost")).resolves.toBeUndefined();
  });

  it("the lookup hook refuses a blocked address at connect time", async () => {
    const server = http.createServer((_, res) => res.end("reached"));
    await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
    const port = (server.address() as { port: number }).port;
    const get = (g: AddressGuard) =>
      new Promise<string>((resolve, reject) => {
        http
          .get({ host: "localhost", port, lookup: g.lookup, family: 4 }, (res) => {
            res.setEncoding("utf8");
            let body = "";
            res.on("data", (d) => (body += d));
            res.on("end", () => resolve(body));
          })
          .on("error", reject);
      });
    try {
      await expect(get(guard)).rejects.toMatchObject({ code: "EBLOCKED" });
      await expect(get(new AddressGuard(["127.0.0.0/8"]))).resolves.toBe("reached");
    } finally {
      server.close();
    }
  });

  it.each(["10.0.0.0/33", "nonsense", "10.0.0.0/8/1", "::1/129", "10.0.0.0/x"])("refuses the range %j", (cidr) => {
    expect(() => parseCidr(cidr)).toThrow();
  });
});
