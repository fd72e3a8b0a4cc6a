// InvocationService: runs apps synchronously or as queued async runs.
// Not implemented yet: every method answers `unimplemented` until the
// invocation issue lands.
import type { ConnectRouter } from "@connectrpc/connect";
import { InvocationService } from "../../gen/skiff/invocation/v4/invocation_pb.js";

export function routes(router: ConnectRouter): void {
  router.service(InvocationService, {});
}
