// Plain text tables for people; --json output is for machines.

/** Left-aligned columns separated by two spaces, headed by upper-case names. */
export function table(headers: string[], rows: string[][]): string {
  const widths = headers.map((h, i) => Math.max(h.length, ...rows.map((r) => r[i].length)));
  const line = (cells: string[]) => cells.map((c, i) => (i === cells.length - 1 ? c : c.padEnd(widths[i]))).join("  ");
  return [line(headers.map((h) => h.toUpperCase())), ...rows.map(line)].join("\n");
}
