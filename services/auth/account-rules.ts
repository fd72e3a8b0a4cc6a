// What names a project and a service account, and the example of an expiry
// that messages give. A leaf module (no imports): the CLI reads a token's
// project and writes its hints with the server's own rules.

/** "p-" then lowercase letters and digits. */
export const PROJECT_ID = /^p-[a-z0-9]{1,40}$/;
/** "sa-" then lowercase letters and digits. */
export const SERVICE_ACCOUNT_ID = /^sa-[a-z0-9]{1,40}$/;

/** An expiry a message can give as an example: 90 days from now, at midnight UTC, so that it is always accepted. */
export function exampleExpiry(now = Date.now()): string {
  return `${new Date(now + 90 * 86_400_000).toISOString().slice(0, 10)}T00:00:00Z`;
}
