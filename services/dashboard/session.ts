// The token the dashboard signs in with, kept in sessionStorage: it lasts as
// long as the browser tab and is never written anywhere more durable.
const KEY = "skiff.token";

export function storedToken(): string | undefined {
  try {
    return sessionStorage.getItem(KEY) ?? undefined;
  } catch {
    return undefined; // storage disabled: the user signs in again on reload
  }
}

export function storeToken(token: string | undefined): void {
  try {
    if (token === undefined) sessionStorage.removeItem(KEY);
    else sessionStorage.setItem(KEY, token);
  } catch {
    // storage disabled: the session lasts until the page is reloaded
  }
}
