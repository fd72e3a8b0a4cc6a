// A logger whose lines tests can read back (pino's JSON, parsed).
import { pino } from "pino";

export function capturingLogger() {
  const lines: { level: number; msg: string; [field: string]: unknown }[] = [];
  const logger = pino({ level: "debug" }, { write: (s: string) => void lines.push(JSON.parse(s)) });
  return { logger, lines };
}
