// Splits a replica's stdout or stderr into lines. A line longer than
// MAX_LINE_CHARS is cut into pieces so one runaway write cannot hold the
// runner's memory; a last line without a newline is flushed at the end.
import type { Readable } from "node:stream";

export const MAX_LINE_CHARS = 16 * 1024;

export function readLines(stream: Readable, onLine: (text: string) => void): void {
  let pending = "";
  stream.setEncoding("utf8");
  stream.on("data", (chunk: string) => {
    // One pass over the chunk: each line is cut out once, the rest kept once (not re-sliced per line).
    const text = pending === "" ? chunk : pending + chunk;
    let start = 0;
    let nl: number;
    while ((nl = text.indexOf("\n", start)) !== -1) {
      emit(text.slice(start, nl));
      start = nl + 1;
    }
    pending = start === 0 ? text : text.slice(start);
    while (pending.length > MAX_LINE_CHARS) {
      onLine(pending.slice(0, MAX_LINE_CHARS));
      pending = pending.slice(MAX_LINE_CHARS);
    }
  });
  stream.on("end", () => {
    if (pending !== "") emit(pending);
    pending = "";
  });
  function emit(line: string): void {
    const text = line.endsWith("\r") ? line.slice(0, -1) : line;
    if (text.length <= MAX_LINE_CHARS) return onLine(text);
    for (let i = 0; i < text.length; i += MAX_LINE_CHARS) onLine(text.slice(i, i + MAX_LINE_CHARS));
  }
}
