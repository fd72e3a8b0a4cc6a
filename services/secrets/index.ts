// Project secrets: their names and limits, their sealed store in KV
// `skiff-project-secrets` (written by the management role), and the view a
// runner follows to give them to replicas as environment variables.
export { secretNameProblem, secretValueProblem } from "./names.js";
export { ProjectSecretStore, SecretsStoreFull, TooManySecrets } from "./store.js";
export type { SecretInfo } from "./store.js";
export { ProjectSecretsView } from "./view.js";
