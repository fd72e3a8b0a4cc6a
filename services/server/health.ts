// Health: one state that feeds the standard grpc.health.v1.Health service,
// GET /healthz (NATS connected) and GET /readyz (connected, provisioned and
// not shutting down; it names the stores that are full, which refuse new
// writes, without failing: the calls that write nothing there still work).
import { EventEmitter, on } from "node:events";
import { Code, ConnectError, type ConnectRouter } from "@connectrpc/connect";
import { Health, HealthCheckResponse_ServingStatus as Serving } from "../../gen/grpc/health/v1/health_pb.js";

export class HealthState {
  private readonly events = new EventEmitter();
  private natsConnected = false;
  private provisioned = false;
  private stopping = false;
  /** Whether the NATS server requires credentials; /readyz says `"nats_auth": false` when it does not. */
  natsAuth: boolean | undefined;
  /** Whether apps run sandboxed; /readyz says `"sandbox": "off"` when they do not. */
  sandbox: boolean | undefined;
  /** Stores at their byte budget that refuse new writes (an async queue, a bucket); /readyz names them. */
  fullStores: string[] = [];
  /** Fully-qualified names of the services this process serves. */
  readonly services = new Set<string>();

  constructor() {
    this.events.setMaxListeners(0);
  }

  /** NATS reachable: what /healthz reports. */
  get live(): boolean {
    return this.natsConnected;
  }

  /** Ready for traffic: what /readyz and grpc.health report. */
  get ready(): boolean {
    return this.natsConnected && this.provisioned && !this.stopping;
  }

  setNatsConnected(connected: boolean): void {
    this.update(() => (this.natsConnected = connected));
  }

  setProvisioned(): void {
    this.update(() => (this.provisioned = true));
  }

  setStopping(): void {
    this.update(() => (this.stopping = true));
  }

  /** Serving status of a service; "" is the whole server. */
  status(service: string): Serving {
    if (service !== "" && !this.services.has(service)) return Serving.SERVICE_UNKNOWN;
    return this.ready ? Serving.SERVING : Serving.NOT_SERVING;
  }

  /** Resolves with the next change of state. */
  changes(signal: AbortSignal): AsyncIterable<unknown> {
    return on(this.events, "change", { signal });
  }

  private update(change: () => void): void {
    const before = this.ready;
    change();
    if (before !== this.ready) this.events.emit("change");
  }
}

/** Registers grpc.health.v1.Health, served on the same port as everything else. */
export function healthRoutes(router: ConnectRouter, state: HealthState): void {
  router.service(Health, {
    check(req) {
      const status = state.status(req.service);
      if (status === Serving.SERVICE_UNKNOWN) throw new ConnectError(`unknown service ${req.service}`, Code.NotFound);
      return { status };
    },
    async *watch(req, ctx) {
      let last = state.status(req.service);
      yield { status: last };
      try {
        for await (const _ of state.changes(ctx.signal)) {
          const now = state.status(req.service);
          if (now !== last) yield { status: (last = now) };
        }
      } catch (err) {
        // The call ended (client gone or server stopping): end the stream quietly.
        if (!ctx.signal.aborted) throw err;
      }
    },
  });
}
