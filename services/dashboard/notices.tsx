// Loading, error and empty states, each saying what to do next.
import type { ReactNode } from "react";
import { describeError } from "./api.js";

export function Loading({ what }: { what: string }) {
  return (
    <p className="notice loading" role="status">
      Loading {what}…
    </p>
  );
}

export function ErrorNotice({ error, retry, what }: { error: unknown; retry?: () => void; what: string }) {
  return (
    <div className="notice error" role="alert">
      <p>
        <strong>Could not load {what}.</strong> {describeError(error)}
      </p>
      {retry && (
        <button type="button" onClick={retry}>
          Try again
        </button>
      )}
    </div>
  );
}

export function Empty({ title, children }: { title: string; children?: ReactNode }) {
  return (
    <div className="notice empty">
      <p>
        <strong>{title}</strong>
      </p>
      {children}
    </div>
  );
}

/** A form's own error (a refused value, a failed submit), announced to screen readers. */
export function FormError({ message }: { message: string | undefined }) {
  if (!message) return null;
  return (
    <p className="notice error" role="alert">
      {message}
    </p>
  );
}
