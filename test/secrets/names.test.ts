// The names and values a project secret may have.
import { describe, expect, it } from "vitest";
import { secretNameProblem, secretValueProblem } from "../../services/secrets/names.js";

describe("secret names and values", () => {
  it("environment variable names are taken", () => {
    for (const name of ["A", "_", "hf_auth_token", "OPENAI_API_KEY", "a1", "x".repeat(128)])
      expect(secretNameProblem(name), name).toBeUndefined();
  });

  it("anything else, and the names skiff sets itself, are refused with the reason", () => {
    expect(secretNameProblem("")).toBe("is required");
    expect(secretNameProblem("x".repeat(129))).toMatch(/at most 128/);
    for (const name of ["1A", "A-B", "A B", "A.B", "É", "A=B", "A\u0000"])
      expect(secretNameProblem(name), name).toMatch(/environment variable name/);
    for (const name of ["PORT", "PATH", "HOME", "LANG"]) expect(secretNameProblem(name), name).toMatch(/set by skiff/);
    for (const name of ["SKIFF_X", "skiff_gate", "Skiff_"]) expect(secretNameProblem(name), name).toMatch(/SKIFF_/);
    // Only the exact names: a longer one is the app's.
    expect(secretNameProblem("PORTS")).toBeUndefined();
  });

  it("values up to 64 KiB of UTF-8 are taken; longer, or with NUL, are not, and the reason never quotes them", () => {
    expect(secretValueProblem("")).toBeUndefined();
    expect(secretValueProblem("é".repeat(32 * 1024))).toBeUndefined();
    expect(secretValueProblem(`${"é".repeat(32 * 1024)}x`)).toBe("is 65537 bytes, more than the 65536 allowed");
    expect(secretValueProblem("a\u0000b")).toMatch(/NUL/);
    expect(secretValueProblem("a\u0000b")).not.toContain("a\u0000b");
  });
});
