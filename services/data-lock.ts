// One skiff process per data folder (docs/deploy.md): the folder holds the
// store of the nats-server skiff starts, its token files, the embedded run
// history and the replicas' folders, none of which two processes can share.
// A second `npm start` on a folder in use must stop before it touches any
// of them: before this lock it took the running skiff's nats-server for a
// leftover of a crash and stopped it, and that skiff went on without NATS.
//
// The lock is SQLite's (better-sqlite3, which the run history uses anyway)
// on `<dataDir>/skiff.lock`: an exclusive lock held for the process's life
// (`locking_mode = EXCLUSIVE`), a POSIX lock that the kernel drops when the
// process ends however it ends, so a crash leaves no stale lock to judge.
// The holder writes its pid beside it (`skiff.pid`), for the message.
// SKIFF_WORKERS' supervisor holds it for its workers (a forked process does
// not inherit it).
import { constants } from "node:fs";
import { mkdir, open, readFile, rm, writeFile } from "node:fs/promises";
import { createRequire } from "node:module";
import path from "node:path";

export const LOCK_FILE = "skiff.lock";
export const PID_FILE = "skiff.pid";

/** The part of better-sqlite3 used here (it has no types of its own in this project). */
interface Connection {
  pragma(sql: string): unknown;
  exec(sql: string): void;
  close(): void;
}

/** The data folder is another process's. */
export class DataFolderInUse extends Error {
  override name = "DataFolderInUse";
}

/**
 * Takes the data folder `dataDir` (made when missing) for this process, or throws DataFolderInUse when
 * another process holds it. Resolves with the function that gives it up (the process's end does too).
 */
export async function lockDataFolder(dataDir: string): Promise<() => Promise<void>> {
  const dir = path.resolve(dataDir);
  await mkdir(dir, { recursive: true });
  const Database = createRequire(import.meta.url)("better-sqlite3") as new (
    file: string,
    options?: { timeout?: number },
  ) => Connection;
  const file = path.join(dir, LOCK_FILE);
  await ownFile(file);
  // No wait: a lock held now is held by a running process.
  const db = new Database(file, { timeout: 0 });
  try {
    db.pragma("locking_mode = EXCLUSIVE");
    // The first write takes the exclusive lock, which EXCLUSIVE mode keeps until the connection closes.
    db.exec("BEGIN EXCLUSIVE; CREATE TABLE IF NOT EXISTS holder (pid INTEGER); COMMIT");
  } catch (err) {
    db.close();
    if ((err as { code?: string }).code !== "SQLITE_BUSY") throw err;
    const pid = Number((await readFile(path.join(dir, PID_FILE), "utf8").catch(() => "")).trim());
    throw new DataFolderInUse(
      `the data folder ${dir} is in use by another skiff${alive(pid) ? ` (pid ${pid})` : ""}: one process per data folder. Stop that one first, or give this one a folder of its own (SKIFF_DATA_DIR)`,
      { cause: err },
    );
  }
  const pidFile = path.join(dir, PID_FILE);
  await writeFile(pidFile, `${process.pid}\n`);
  let released = false;
  return async () => {
    if (released) return;
    released = true;
    await rm(pidFile, { force: true });
    db.close();
  };
}

/**
 * Makes the lock file this user's alone (0600, created so, not through a link): a lock is taken by whoever
 * can open the file, and another user's read lock on its bytes kept skiff from starting again.
 */
async function ownFile(file: string): Promise<void> {
  const handle = await open(file, constants.O_CREAT | constants.O_RDWR | constants.O_NOFOLLOW, 0o600);
  try {
    const { uid } = await handle.stat();
    if (process.getuid !== undefined && uid !== process.getuid())
      throw new Error(
        `${file} belongs to another user (uid ${uid}): remove it, or give skiff a data folder of its own`,
      );
    await handle.chmod(0o600);
  } finally {
    await handle.close();
  }
}

/** Whether a process of that id runs now (the pid file may be a stopped one's). */
function alive(pid: number): boolean {
  if (!Number.isInteger(pid) || pid <= 0) return false;
  try {
    process.kill(pid, 0);
    return true;
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === "EPERM";
  }
}
