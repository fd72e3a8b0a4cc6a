// Who is calling: projects' service accounts, bearer tokens (EdDSA JWTs),
// admin tokens, signing keys, and the interceptor that checks every RPC.
export { exampleExpiry, PROJECT_ID, SERVICE_ACCOUNT_ID } from "./account-rules.js";
export { accountKey, decodeAccount, newProjectId, newServiceAccountId } from "./accounts.js";
export type { ServiceAccountRecord } from "./accounts.js";
export { newAdminToken, sameToken } from "./admin-tokens.js";
export { bearerAuth } from "./bearer.js";
export type { AdminTokens } from "./admin-tokens.js";
export { actorOf, principalOf, startAuth } from "./auth.js";
export type { Auth, Principal } from "./auth.js";
export type { Authenticator } from "./authenticator.js";
export { issueToken } from "./tokens.js";
export type { TokenSubject } from "./tokens.js";
