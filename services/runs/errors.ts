// Why an invocation or a deployment did not produce an app's answer. The
// gateway maps a run's (outcome.ts) to Connect codes and so to HTTP:
// FunctionNotFound 404, InvalidArguments 400 (a Cortex body that does not
// fit the function's parameters: the caller's error), Overloaded 429 with Retry-After, RunTimeout 504,
// Cancelled 499 "canceled", ReplicaCrashed, StartFailed and AppNotFound 503
// (the app exists, but no runner has it deployed). PrepareFailed is a
// deployment's: ManagementService answers it with failed_precondition.
// RequestBodyFailed: the caller's body, streamed to a replica, broke (the
// REST answer is the body's own error; across NATS the gateway knows it,
// and a body lost on the way is answered as ReplicaCrashed).

import { ClientGoneError } from "../server/index.js";

type RunnerErrorName =
  | "AppNotFound"
  | "FunctionNotFound"
  | "InvalidArguments"
  | "Overloaded"
  | "RunTimeout"
  | "ReplicaCrashed"
  | "Cancelled"
  | "StartFailed"
  | "PrepareFailed";

export abstract class RunnerError extends Error {
  abstract override readonly name: RunnerErrorName;
}

export class AppNotFound extends RunnerError {
  override readonly name = "AppNotFound";
  constructor(
    readonly projectId: string,
    readonly appName: string,
  ) {
    super(`app ${projectId}/${appName} is not deployed on this runner`);
  }
}

export class FunctionNotFound extends RunnerError {
  override readonly name = "FunctionNotFound";
  constructor(
    readonly appName: string,
    readonly functionName: string,
  ) {
    super(`app ${appName} has no public function "${functionName}"`);
  }
}

/** A Cortex call's body does not fit its function's parameters (a missing or unknown one): the caller's error. */
export class InvalidArguments extends RunnerError {
  override readonly name = "InvalidArguments";
}

export class Overloaded extends RunnerError {
  override readonly name = "Overloaded";
  constructor(
    message: string,
    /** Seconds after which a retry may find a free slot. */
    readonly retryAfterSeconds: number,
  ) {
    super(message);
  }
}

export class RunTimeout extends RunnerError {
  override readonly name = "RunTimeout";
  constructor(readonly seconds: number) {
    super(`the run took longer than response_grace_period (${seconds} s); its replica was stopped`);
  }
}

export class ReplicaCrashed extends RunnerError {
  override readonly name = "ReplicaCrashed";
  constructor(message: string, options?: ErrorOptions) {
    super(message, options);
  }
}

/**
 * The caller's body broke while it streamed to the app: the caller went away
 * (`gone`), it passed the size limit (`too_large`), or its frames were lost
 * between a gateway and this runner (`lost`). The replica is not to blame.
 */
export class RequestBodyFailed extends Error {
  override readonly name = "RequestBodyFailed";
  constructor(
    message: string,
    readonly reason: "gone" | "too_large" | "lost",
    options?: ErrorOptions,
  ) {
    super(message, options);
  }
}

/** What a failure of the caller's body (its reader's error) means for the run. */
export function requestBodyFailed(err: unknown): RequestBodyFailed {
  if (err instanceof RequestBodyFailed) return err;
  const message = err instanceof Error ? err.message : String(err);
  return new RequestBodyFailed(message, err instanceof ClientGoneError ? "gone" : "too_large", { cause: err });
}

export class Cancelled extends RunnerError {
  override readonly name = "Cancelled";
  constructor(options?: ErrorOptions) {
    super("the run was cancelled", options);
  }
}

export class StartFailed extends RunnerError {
  override readonly name = "StartFailed";
  constructor(message: string, options?: ErrorOptions) {
    super(message, options);
  }
}

/** Installing dependencies or reading a Cortex module failed at deploy time. */
export class PrepareFailed extends RunnerError {
  override readonly name = "PrepareFailed";
  constructor(message: string, options?: ErrorOptions) {
    super(message, options);
  }
}
