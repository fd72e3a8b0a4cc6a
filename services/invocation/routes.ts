// InvocationService: runs apps synchronously or as queued async runs.
import type { ConnectRouter } from "@connectrpc/connect";
import { InvocationService } from "../../gen/skiff/invocation/v4/invocation_pb.js";
import type { InvocationDeps } from "./deps.js";
import { run } from "./run.js";
import { runStream } from "./run-stream.js";

export function routes(router: ConnectRouter, deps: InvocationDeps): void {
  router.service(InvocationService, {
    run: (req, ctx) => run(deps, req, ctx),
    runStream: (req, ctx) => runStream(deps, req, ctx),
  });
}
