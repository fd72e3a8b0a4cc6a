// Runs: their states and records, their protobuf messages, events, results,
// how a run ended, the invoke contract between gateway and runner (and its
// errors), moving large bodies through the object store, cancelling a run from any process, the
// set of these helpers that a process builds once (RunContext), and the run
// history (every run, projected into SQL for listing and stats).
export { openRunContext } from "./context.js";
export type { RunContext } from "./context.js";
export { RunControl, broadcastAbort, requestCancel } from "./control.js";
export { runMessage } from "./convert.js";
export {
  AppNotFound,
  Cancelled,
  FunctionNotFound,
  InvalidArguments,
  Overloaded,
  PrepareFailed,
  ReplicaCrashed,
  RequestBodyFailed,
  requestBodyFailed,
  RunTimeout,
  RunnerError,
  StartFailed,
} from "./errors.js";
export { HISTORY_FOLDER, openRunHistory, timeOfId } from "./history/index.js";
export type {
  HistoryBudgetOptions,
  ListQuery,
  MinuteStats,
  RunHistory,
  RunHistoryOptions,
  RunPage,
} from "./history/index.js";
export {
  DELIVERY_RECORD_HEADER,
  publishRunEvent,
  publishRunEventUnacked,
  recordOfEvent,
  RUNNING_EVENT_AFTER_MS,
} from "./events.js";
export { finishAsync, finishSync, republishFinal } from "./finish.js";
export type { FinishDeps } from "./finish.js";
export { STREAM_BODIES_ABOVE } from "./invoke.js";
export type { AnswerLimit, AnswerStream, InvokeRequest, InvokeResponse, StreamEnd } from "./invoke.js";
export { NoRunner, contentTypeOf, outcomeOfAnswer, outcomeOfError, runFailure } from "./outcome.js";
export type { RunOutcome } from "./outcome.js";
export { queuedRuns } from "./queue.js";
export { newRunId } from "./run-id.js";
export { RunResults } from "./results.js";
export { TRIM_FROM, TRIM_TO, trimResults } from "./results-budget.js";
export type { Body } from "./results.js";
export { sweepStaleSyncRuns } from "./stale-sync.js";
export type { StaleSyncSweep } from "./stale-sync.js";
export { RUN_STATUSES, isFinal } from "./status.js";
export type { RunStatus } from "./status.js";
export { RunStore, copyRecord, decodeRunRecord, isWrongRevision, revisionsOf, runKey } from "./store.js";
export type { RunRecord } from "./store.js";
export { BodyTransfer } from "./transfer.js";
