// What the management handlers work with; start.ts builds it once per process.
import type { Logger } from "../shared/logger.js";
import type { TokenSubject } from "../shared/tokens.js";
import type { ProjectStore } from "./project-store.js";
import type { ServiceAccountStore } from "./service-account-store.js";

export interface ManagementDeps {
  projects: ProjectStore;
  serviceAccounts: ServiceAccountStore;
  /** Signs a token with the cluster's current key. */
  issueToken: (subject: TokenSubject) => Promise<string>;
  logger: Logger;
}
