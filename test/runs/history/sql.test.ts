// The embedded run history database: a fresh one is a copy of a template made
// once per PGlite version beside the installed package, and copies are
// databases of their own.
import { access, mkdtemp, readdir, readFile, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { openPglite } from "../../../services/runs/history/sql.js";
import { TEST_ROOT } from "../../helpers/paths.js";

const tmp = await mkdtemp(path.join(tmpdir(), "skiff-sql-"));
afterAll(() => rm(tmp, { recursive: true, force: true }));

describe("run history - the embedded database's files", () => {
  it("a fresh database is made from the template of this PGlite version, and each copy is a database of its own", async () => {
    const a = await openPglite(path.join(tmp, "a", "run-history"));
    const b = await openPglite(path.join(tmp, "b", "run-history"));
    try {
      const { version } = JSON.parse(
        await readFile(path.resolve(TEST_ROOT, "../node_modules/@electric-sql/pglite/package.json"), "utf8"),
      ) as { version: string };
      const template = path.resolve(TEST_ROOT, `../node_modules/.cache/skiff/run-history-pglite-${version}`);
      await access(path.join(template, "PG_VERSION"));
      await a.query("CREATE TABLE t (x int)");
      await a.query("INSERT INTO t VALUES (1)");
      expect(await a.query("SELECT x FROM t")).toEqual([{ x: 1 }]);
      await expect(b.query("SELECT x FROM t")).rejects.toThrow(/does not exist/);
      // Nothing half made is left beside either.
      expect((await readdir(path.join(tmp, "a"))).sort()).toEqual(["run-history"]);
    } finally {
      await a.close();
      await b.close();
    }
  });
});
