// The signed-in session, shared by every page.
import { createContext, useContext } from "react";
import type { GetIdentityResponse } from "../../gen/skiff/management/v2/management_pb.js";
import type { Management } from "./api.js";

export interface Session {
  client: Management;
  identity: GetIdentityResponse;
  signOut: () => void;
}

export const SessionContext = createContext<Session | undefined>(undefined);

export function useSession(): Session {
  const s = useContext(SessionContext);
  if (!s) throw new Error("useSession outside a signed-in page");
  return s;
}
