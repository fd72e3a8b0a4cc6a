// Logging: JSON lines with pino; human-readable when stdout is a terminal.
import { pino, type Logger } from "pino";

export type { Logger };

export function createLogger(level: string, options: { pretty?: boolean } = {}): Logger {
  const pretty = options.pretty ?? (process.stdout.isTTY === true && process.env.CI === undefined);
  return pino({
    level,
    base: { pid: process.pid },
    // Never let a bearer token or webhook secret reach a log line.
    redact: {
      paths: [
        "token",
        "*.token",
        "authorization",
        "*.authorization",
        "headers.authorization",
        "secret",
        "*.secret",
        'headers["x-webhook-secret"]',
      ],
      censor: "[redacted]",
    },
    ...(pretty
      ? { transport: { target: "pino-pretty", options: { colorize: true, translateTime: "SYS:HH:MM:ss.l" } } }
      : {}),
  });
}

/** A logger that writes nothing, for tests and tools. */
export const silentLogger: Logger = pino({ level: "silent" });
