// ManagementService: projects, service accounts, apps, runs, webhook
// deliveries, app statistics and project secrets.
import type { ConnectRouter } from "@connectrpc/connect";
import { ManagementService } from "../../gen/skiff/management/v2/management_pb.js";
import { appHandlers } from "./apps.js";
import type { ManagementDeps } from "./deps.js";
import { projectHandlers } from "./projects.js";
import { secretHandlers } from "./secrets.js";
import { serviceAccountHandlers } from "./service-accounts.js";
import { statsHandlers } from "./stats.js";

export function routes(router: ConnectRouter, deps: ManagementDeps): void {
  router.service(ManagementService, {
    ...projectHandlers(deps),
    ...serviceAccountHandlers(deps),
    ...appHandlers(deps),
    ...deps.runs.handlers,
    ...statsHandlers(deps),
    ...secretHandlers(deps),
  });
}
