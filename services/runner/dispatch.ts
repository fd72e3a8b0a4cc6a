// The runner's side of sync runs sent over NATS: for each app deployed
// here, a subscription to `skiff.invoke.{project}.{app}` in queue group
// "runners", so one runner hosting the app takes each request. The answer
// is the runner's InvokeResponse or its typed error (runs/wire.ts); the
// gateway that asked writes the run record.
import type { Msg, NatsConnection, Subscription } from "nats";
import type { Logger } from "../config/index.js";
import { subjects } from "../nats/index.js";
import {
  type RunControl,
  decodeRequest,
  encodeErrorReply,
  encodeReply,
  type BodyTransfer,
  RunnerError,
  StartFailed,
} from "../runs/index.js";
import type { AppRef } from "./deployed-apps.js";
import type { Runner } from "./runner.js";

export interface DispatchDeps {
  nc: NatsConnection;
  runner: Runner;
  transfer: BodyTransfer;
  control: RunControl;
  logger: Logger;
}

export class SyncDispatch {
  private readonly subs = new Map<string, Subscription>();

  constructor(private readonly deps: DispatchDeps) {}

  add(app: AppRef): void {
    const key = `${app.projectId}.${app.appName}`;
    if (this.subs.has(key)) return;
    const sub = this.deps.nc.subscribe(subjects.invoke(app.projectId, app.appName), {
      queue: subjects.invokeQueueGroup,
      callback: (err, msg) => {
        if (!err) void this.answer(app, msg);
      },
    });
    this.subs.set(key, sub);
  }

  remove(app: AppRef): void {
    const key = `${app.projectId}.${app.appName}`;
    this.subs.get(key)?.unsubscribe();
    this.subs.delete(key);
  }

  close(): void {
    for (const sub of this.subs.values()) sub.unsubscribe();
    this.subs.clear();
  }

  private async answer(app: AppRef, msg: Msg): Promise<void> {
    const { runner, transfer, control, logger } = this.deps;
    let runId = "";
    try {
      const req = await decodeRequest(transfer, msg.data);
      runId = req.runId;
      const controller = new AbortController();
      req.signal = controller.signal;
      const work = runner.invoke(app.projectId, app.appName, req);
      control.track(runId, controller, work);
      msg.respond(await encodeReply(transfer, runId, await work));
    } catch (err) {
      if (!(err instanceof RunnerError))
        logger.error({ err, runId, app: `${app.projectId}/${app.appName}` }, "sync run failed inside the runner");
      msg.respond(
        encodeErrorReply(err instanceof RunnerError ? err : new StartFailed("the runner could not run the request")),
      );
    }
  }
}
