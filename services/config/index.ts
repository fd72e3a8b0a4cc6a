// The bottom layer: settings (defaults, SKIFF_* variables, validation),
// logging and the clock of timers. Imports nothing of skiff's own.
export {
  ADDRESS_FILE,
  ConfigError,
  DEFAULT_DATA_DIR,
  DEFAULT_FIRST_BYTES_TIMEOUT_MS,
  DEFAULT_HEADERS_TIMEOUT_MS,
  DEFAULT_HTTP2_IDLE_TIMEOUT_MS,
  DEFAULT_KEEP_ALIVE_TIMEOUT_MS,
  DEFAULT_MAX_CONNECTIONS_PER_ADDRESS,
  DEFAULT_HOST,
  DEFAULT_NATS_PROBE_URL,
  DEFAULT_PORT,
  DEFAULT_MAX_RESULT_BYTES,
  DEFAULT_PROJECT_MAX_REPLICAS,
  DEFAULT_PROJECT_MEMORY_MB,
  DEFAULT_REPLICA_LOG_LINES_PER_SECOND,
  DEFAULT_REPLICA_DENIED_CIDRS,
  MAX_RUN_SECONDS,
  MIN_STORE_BUDGET_BYTES,
  loadConfig,
  natsAuth,
  parseRoles,
  workerQuotas,
} from "./config.js";
export type { Config, NatsAuth, NatsCredentials, Role } from "./config.js";
export { realClock, sleep } from "./clock.js";
export type { Clock, ClockTimer } from "./clock.js";
export { createLogger } from "./logger.js";
export { editDistance } from "./edit-distance.js";
export type { Logger } from "./logger.js";
export { SECRETS_KEY_BYTES, SecretsKeyError, parseCidr, parsePrivateKey, parseSecretsKey } from "./parse.js";
