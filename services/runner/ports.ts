// Ports for replicas: a free one from the system for an app that reads
// PORT, or, for an app with a fixed `port`, a lease on it where replicas
// share this machine's ports (SKIFF_SANDBOX=off), which one replica of one
// app holds at a time. A sandboxed replica listens in a network namespace
// of its own, where its port is its alone: nothing is leased.
import net from "node:net";
import { StartFailed } from "../runs/index.js";

/** A port the system reports free now; the replica binds it moments later. */
export function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = net.createServer();
    server.unref();
    server.on("error", reject);
    // Exclusive: in a worker of SKIFF_WORKERS, a plain listen would go to the supervisor, whose port 0 is one
    // port shared by every worker, given again at each call.
    server.listen({ port: 0, host: "127.0.0.1", exclusive: true }, () => {
      const { port } = server.address() as net.AddressInfo;
      server.close(() => resolve(port));
    });
  });
}

interface Lease {
  owner: string;
  released: Promise<void>;
  release: () => void;
}

export interface PortUse {
  /** The replica runs in a sandbox, with a network namespace of its own. */
  sandboxed?: boolean;
}

export class PortLeases {
  private readonly leases = new Map<number, Lease>();

  /**
   * Resolves with a release function once a replica of `owner` may bind
   * `port`. A sandboxed replica may at once. Otherwise the same owner (the
   * next version of the app) waits for its own lease, and another app gets
   * StartFailed at once, which says only that the port is in use on this
   * machine: never which project or app holds it.
   */
  async acquire(port: number, owner: string, use: PortUse = {}): Promise<() => void> {
    if (use.sandboxed) return () => undefined;
    for (let held = this.leases.get(port); held; held = this.leases.get(port)) {
      if (held.owner !== owner) throw new StartFailed(`port ${port} is in use on this machine`);
      await held.released;
    }
    let release!: () => void;
    const released = new Promise<void>((resolve) => (release = resolve));
    const lease: Lease = { owner, released, release };
    this.leases.set(port, lease);
    return () => {
      if (this.leases.get(port) === lease) this.leases.delete(port);
      release();
    };
  }
}
