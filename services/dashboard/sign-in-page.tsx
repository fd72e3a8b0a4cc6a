// Sign in by pasting a token: an admin token or a service account's token.
// GetIdentity checks it before anything is kept.
import { useEffect, useState, type FormEvent } from "react";
import { describeError } from "./api.js";
import { FormError } from "./notices.js";

/** Where this skiff keeps its admin token, as the server tells (start.ts, /sign-in-hint.json). */
type Hint = { adminToken: "SKIFF_ADMIN_TOKEN" } | { adminToken: "file"; file?: string };

function useHint(): Hint | undefined {
  const [hint, setHint] = useState<Hint>();
  useEffect(() => {
    const controller = new AbortController();
    fetch("/sign-in-hint.json", { signal: controller.signal })
      .then((res) => (res.ok ? (res.json() as Promise<Hint>) : undefined))
      .then(setHint)
      .catch(() => undefined); // the general hint stays
    return () => controller.abort();
  }, []);
  return hint;
}

function AdminTokenHint({ hint }: { hint: Hint | undefined }) {
  if (hint?.adminToken === "SKIFF_ADMIN_TOKEN")
    return <>The admin token (the one skiff was given in SKIFF_ADMIN_TOKEN)</>;
  if (hint?.adminToken === "file" && hint.file !== undefined)
    return (
      <>
        The admin token (in <code>{hint.file}</code>)
      </>
    );
  return (
    <>
      The admin token (the file <code>admin-token</code> in skiff&apos;s data folder, <code>SKIFF_DATA_DIR</code>)
    </>
  );
}

export function SignInPage({
  signIn,
  notice,
}: {
  signIn: (token: string) => Promise<void>;
  notice: string | undefined;
}) {
  const [token, setToken] = useState("");
  const [error, setError] = useState<string>();
  const [busy, setBusy] = useState(false);
  const hint = useHint();

  const submit = async (e: FormEvent) => {
    e.preventDefault();
    const t = token.trim().replace(/^Bearer\s+/i, "");
    if (t === "") {
      setError("Paste a token first.");
      return;
    }
    setBusy(true);
    setError(undefined);
    try {
      await signIn(t);
    } catch (err) {
      setError(describeError(err));
      setBusy(false);
    }
  };

  return (
    <main className="sign-in">
      <h1>
        <span className="brand-mark" aria-hidden="true" /> skiff
      </h1>
      <form onSubmit={submit} className="card" aria-labelledby="sign-in-title">
        <h2 id="sign-in-title">Sign in</h2>
        {notice && (
          <p className="notice warn" role="status">
            {notice}
          </p>
        )}
        <label htmlFor="token">API token</label>
        <input
          id="token"
          name="token"
          type="password"
          autoComplete="off"
          spellCheck={false}
          value={token}
          onChange={(e) => setToken(e.target.value)}
          aria-describedby="token-help"
          aria-invalid={error !== undefined}
          autoFocus
        />
        <p id="token-help" className="help">
          <AdminTokenHint hint={hint} /> or a service account&apos;s token. It is kept in this browser tab only, until
          you sign out or close the tab.
        </p>
        <FormError message={error} />
        <button type="submit" className="primary" disabled={busy}>
          {busy ? "Checking…" : "Sign in"}
        </button>
      </form>
    </main>
  );
}
