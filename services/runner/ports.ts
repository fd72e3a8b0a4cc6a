// Ports for replicas: a free one from the system for an app that reads
// PORT, or a lease on the fixed `port` of an app that cannot, which one
// replica of one app holds at a time on this machine.
import net from "node:net";
import { StartFailed } from "../runs/index.js";

/** A port the system reports free now; the replica binds it moments later. */
export function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = net.createServer();
    server.unref();
    server.on("error", reject);
    server.listen(0, "127.0.0.1", () => {
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

export class PortLeases {
  private readonly leases = new Map<number, Lease>();

  /**
   * Resolves with a release function once `port` is free of other replicas.
   * The same owner (the next version of the app) waits for it; another app
   * gets StartFailed at once.
   */
  async acquire(port: number, owner: string): Promise<() => void> {
    for (let held = this.leases.get(port); held; held = this.leases.get(port)) {
      if (held.owner !== owner) throw new StartFailed(`port ${port} is in use by app ${held.owner} on this runner`);
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
