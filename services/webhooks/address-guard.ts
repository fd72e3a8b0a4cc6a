// SSRF guard for webhook deliveries: a webhook may not reach loopback,
// private, link-local (cloud metadata), CGNAT, multicast or reserved
// addresses unless SKIFF_WEBHOOK_ALLOWED_CIDRS exempts them. The check runs
// on the address the connection will use (a `lookup` hook for http.request),
// so a name that resolves differently later (DNS rebinding) cannot pass.
import dns from "node:dns";
import net from "node:net";
import { parseCidr } from "../config/index.js";

const BLOCKED_V4 = [
  ["0.0.0.0", 8], // "this" network
  ["10.0.0.0", 8], // private
  ["100.64.0.0", 10], // CGNAT
  ["127.0.0.0", 8], // loopback
  ["169.254.0.0", 16], // link-local, cloud metadata (169.254.169.254)
  ["172.16.0.0", 12], // private
  ["192.0.0.0", 24], // IETF protocol assignments
  ["192.0.2.0", 24], // documentation
  ["192.168.0.0", 16], // private
  ["198.18.0.0", 15], // benchmarking
  ["198.51.100.0", 24], // documentation
  ["203.0.113.0", 24], // documentation
  ["224.0.0.0", 4], // multicast
  ["240.0.0.0", 4], // reserved, broadcast
] as const;

const BLOCKED_V6 = [
  ["::", 128], // unspecified
  ["::1", 128], // loopback
  ["64:ff9b::", 96], // NAT64 (embeds IPv4)
  ["100::", 64], // discard
  ["2001:db8::", 32], // documentation
  ["fc00::", 7], // unique local (incl. fd00:ec2::254 metadata)
  ["fe80::", 10], // link-local
  ["ff00::", 8], // multicast
] as const;

export class BlockedAddressError extends Error {
  override name = "BlockedAddressError";
  readonly code = "EBLOCKED";
  constructor(
    readonly host: string,
    readonly address: string,
  ) {
    super(
      `webhook host ${host} resolves to ${address}, a loopback, private, link-local or reserved address; allow it with SKIFF_WEBHOOK_ALLOWED_CIDRS`,
    );
  }
}

export class AddressGuard {
  private readonly blocked = new net.BlockList();
  private readonly allowed = new net.BlockList();

  /** allowedCidrs: ranges exempt from the guard, e.g. ["127.0.0.0/8", "::1/128"]. */
  constructor(readonly allowedCidrs: readonly string[] = []) {
    for (const [a, p] of BLOCKED_V4) this.blocked.addSubnet(a, p, "ipv4");
    for (const [a, p] of BLOCKED_V6) this.blocked.addSubnet(a, p, "ipv6");
    for (const cidr of allowedCidrs) {
      const { address, prefix, family } = parseCidr(cidr);
      this.allowed.addSubnet(address, prefix, family);
    }
  }

  /** Whether a connection to this IP address is refused. */
  isBlocked(address: string): boolean {
    const family = net.isIP(address) === 6 ? "ipv6" : "ipv4";
    const v4 = family === "ipv6" ? mappedV4(address) : undefined;
    if (v4 !== undefined) return this.isBlocked(v4);
    return this.blocked.check(address, family) && !this.allowed.check(address, family);
  }

  /** Throws BlockedAddressError when any address the host resolves to is refused. */
  async check(host: string): Promise<void> {
    const bare = host.startsWith("[") ? host.slice(1, -1) : host;
    const addresses = net.isIP(bare) ? [bare] : (await dns.promises.lookup(bare, { all: true })).map((a) => a.address);
    for (const a of addresses) if (this.isBlocked(a)) throw new BlockedAddressError(host, a);
  }

  /** A `lookup` for http.request that refuses blocked addresses at connect time. */
  readonly lookup: net.LookupFunction = (hostname, options, callback) => {
    dns.lookup(hostname, { ...options, all: true }, (err, addresses) => {
      if (err) return callback(err, "", 0);
      const list = addresses as dns.LookupAddress[];
      const bad = list.find((a) => this.isBlocked(a.address));
      if (bad)
        return callback(new BlockedAddressError(hostname, bad.address) as unknown as NodeJS.ErrnoException, "", 0);
      if (options.all) return (callback as unknown as (e: null, a: dns.LookupAddress[]) => void)(null, list);
      callback(null, list[0].address, list[0].family);
    });
  };
}

/** The IPv4 address inside an IPv4-mapped IPv6 address (::ffff:a.b.c.d), if it is one. */
function mappedV4(address: string): string | undefined {
  const m = /^::ffff:(\d+\.\d+\.\d+\.\d+)$/i.exec(address);
  if (m) return m[1];
  const hex = /^::ffff:([0-9a-f]{1,4}):([0-9a-f]{1,4})$/i.exec(address);
  if (!hex) return undefined;
  const hi = parseInt(hex[1], 16);
  const lo = parseInt(hex[2], 16);
  return `${hi >> 8}.${hi & 255}.${lo >> 8}.${lo & 255}`;
}
