// The runner's side of sync runs sent over NATS: for each app deployed
// here, a subscription to `skiff.invoke.{project}.{app}` in queue group
// "runners", so one runner hosting the app takes each request, and one to
// `skiff.invoke-body.{project}.{app}` for requests whose body follows them
// (runs/body-wire.ts), which runners that cannot read those never get. The answer
// is the runner's InvokeResponse or its typed error (runs/wire.ts); the
// gateway that asked writes the run record.
import type { Msg, NatsConnection } from "nats";
import type { Logger } from "../config/index.js";
import { subjects } from "../nats/index.js";
import {
  type RunControl,
  decodeRequest,
  encodeErrorReply,
  encodeReply,
  errorMeta,
  StreamSender,
  BodyReceiver,
  type BodyTransfer,
  ReplicaCrashed,
  RequestBodyFailed,
  RunnerError,
  StartFailed,
} from "../runs/index.js";
import { AppSubscriptions } from "./app-subscriptions.js";
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
  private readonly subs: AppSubscriptions;

  constructor(private readonly deps: DispatchDeps) {
    this.subs = new AppSubscriptions(
      deps.nc,
      (app) => [subjects.invoke(app.projectId, app.appName), subjects.invokeBodyFollows(app.projectId, app.appName)],
      (app, msg) => this.answer(app, msg),
    );
  }

  add(app: AppRef): void {
    this.subs.add(app);
  }

  /** Drained (see app-subscriptions.ts): requests already routed here are answered. */
  remove(app: AppRef): void {
    this.subs.remove(app);
  }

  /** Stops taking requests; resolves once those already routed here have been answered. */
  close(): Promise<void> {
    return this.subs.close();
  }

  private async answer(app: AppRef, msg: Msg): Promise<void> {
    const { nc, runner, transfer, control, logger } = this.deps;
    let runId = "";
    let ended!: () => void;
    const done = new Promise<void>((resolve) => (ended = resolve));
    const asRunnerError = (err: unknown): RunnerError => {
      if (err instanceof RunnerError) return err;
      // The caller's body broke: the gateway knows why when it broke there; lost on the way, it reads as a crash.
      if (err instanceof RequestBodyFailed) return new ReplicaCrashed(err.message);
      logger.error({ err, runId, app: `${app.projectId}/${app.appName}` }, "sync run failed inside the runner");
      return new StartFailed("the runner could not run the request");
    };
    try {
      const req = await decodeRequest(transfer, msg.data);
      runId = req.runId;
      const controller = new AbortController();
      req.signal = controller.signal;
      // A large body follows the request as the caller sends it (body-wire.ts).
      if (req.bodyFrom) req.bodyStream = new BodyReceiver(nc, req.bodyFrom);
      // A cancel reaches the run until its body has gone, a streamed one's too.
      control.track(runId, controller, done);
      const res = await runner.invoke(app.projectId, app.appName, req);
      if (res.stream && req.streamTo) {
        const sender = new StreamSender(nc, req.streamTo, transfer.limit);
        msg.respond(await encodeReply(transfer, runId, { ...res, body: new Uint8Array(0) }, sender.creditTo));
        await sender.send(res.stream, (err) => errorMeta(asRunnerError(err)));
      } else {
        msg.respond(await encodeReply(transfer, runId, res));
      }
    } catch (err) {
      msg.respond(encodeErrorReply(asRunnerError(err)));
    } finally {
      ended();
    }
  }
}
