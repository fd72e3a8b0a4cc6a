// The dashboard: a session (restored from this tab's storage), then the page
// the URL names.
import { useCallback, useEffect, useMemo, useState } from "react";
import { describeError, managementClient } from "./api.js";
import { Shell } from "./shell.js";
import { SessionContext, type Session } from "./session-context.js";
import { SignInPage } from "./sign-in-page.js";
import { storedToken, storeToken } from "./session.js";

const REFUSED =
  "Your session ended: skiff no longer accepts the token (it expired, or its service account was deleted). Sign in again.";

export function App() {
  const [session, setSession] = useState<Omit<Session, "signOut">>();
  const [restoring, setRestoring] = useState(() => storedToken() !== undefined);
  const [notice, setNotice] = useState<string>();

  const signOut = useCallback((why?: string) => {
    storeToken(undefined);
    setSession(undefined);
    setNotice(why);
  }, []);

  const signIn = useCallback(
    async (token: string) => {
      // Only a token that was accepted once ends the session when refused later.
      let accepted = false;
      const client = managementClient(token, () => accepted && signOut(REFUSED));
      const identity = await client.getIdentity({});
      accepted = true;
      storeToken(token);
      setNotice(undefined);
      setSession({ client, identity });
    },
    [signOut],
  );

  useEffect(() => {
    const token = storedToken();
    if (token === undefined) return;
    signIn(token)
      .catch((err) => signOut(`Could not restore your session: ${describeError(err)}`))
      .finally(() => setRestoring(false));
  }, [signIn, signOut]);

  const value = useMemo(() => session && { ...session, signOut: () => signOut() }, [session, signOut]);

  if (restoring) {
    return (
      <p className="notice loading" role="status">
        Checking your session…
      </p>
    );
  }
  if (!value) return <SignInPage signIn={signIn} notice={notice} />;
  return (
    <SessionContext.Provider value={value}>
      <Shell />
    </SessionContext.Provider>
  );
}
