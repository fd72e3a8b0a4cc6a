// Queue-group subscriptions per app a runner hosts (one per subject), for
// the requests it takes over NATS (sync runs and WebSocket handshakes,
// nats.ts). Removing an app or closing drains, not just unsubscribes: a
// request the server routed here before it heard the unsubscribe, or that
// waits in the client's buffer, is handled (by the app, or with the app's
// absence) instead of dropped, which would leave its gateway waiting for a
// reply that never comes. close() resolves once every request taken has
// been handled.
import type { Msg, NatsConnection, Subscription } from "nats";
import { subjects } from "../nats/index.js";

export interface AppRef {
  projectId: string;
  appName: string;
}

/** A subject of the app's, and what handles its requests. */
type AppRoute = [subject: string, handle: (app: AppRef, msg: Msg) => Promise<void>];

export class AppSubscriptions {
  private readonly subs = new Map<string, Subscription[]>();
  /** Requests taken and not yet handled. */
  private readonly handling = new Set<Promise<void>>();

  constructor(
    private readonly nc: NatsConnection,
    /** The subjects an app's requests come on, and their handlers. */
    private readonly routesOf: (app: AppRef) => readonly AppRoute[],
  ) {}

  add(app: AppRef): void {
    const key = `${app.projectId}.${app.appName}`;
    if (this.subs.has(key)) return;
    this.subs.set(
      key,
      this.routesOf(app).map(([subject, handle]) =>
        this.nc.subscribe(subject, {
          queue: subjects.invokeQueueGroup,
          callback: (err, msg) => {
            if (err) return;
            const handled = handle(app, msg);
            this.handling.add(handled);
            void handled.finally(() => this.handling.delete(handled));
          },
        }),
      ),
    );
  }

  remove(app: AppRef): void {
    const key = `${app.projectId}.${app.appName}`;
    for (const sub of this.subs.get(key) ?? []) void sub.drain().catch(() => undefined);
    this.subs.delete(key);
  }

  /** Takes no more requests; resolves once those already routed here have been handled. */
  async close(): Promise<void> {
    const subs = [...this.subs.values()].flat();
    this.subs.clear();
    await Promise.all(subs.map((sub) => sub.drain().catch(() => undefined)));
    await Promise.allSettled([...this.handling]);
  }
}
