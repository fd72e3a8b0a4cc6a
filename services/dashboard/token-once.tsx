// The token of a service account just created: shown this once, with a copy
// button and the warning that it cannot be shown again.
import { useEffect, useRef, useState } from "react";

export function TokenOnce({ name, token, onDone }: { name: string; token: string; onDone: () => void }) {
  const field = useRef<HTMLInputElement>(null);
  const box = useRef<HTMLElement>(null);
  const [copied, setCopied] = useState<string>();

  // Move focus to the token so keyboard and screen-reader users land on it.
  useEffect(() => box.current?.focus(), []);

  const copy = async () => {
    try {
      // The Clipboard API exists only on secure origins (https, localhost).
      await navigator.clipboard.writeText(token);
      setCopied("Copied to the clipboard.");
    } catch {
      field.current?.select();
      setCopied(document.execCommand("copy") ? "Copied to the clipboard." : "Selected: press Ctrl+C (⌘C) to copy.");
    }
  };

  return (
    <section className="card token-once" aria-labelledby="token-title" tabIndex={-1} ref={box}>
      <h2 id="token-title">Token of {name}</h2>
      <p className="notice warn" role="alert">
        <strong>Copy this token now: it is shown only once.</strong> skiff does not keep it, and leaving this page hides
        it for good. Store it as a secret; if you lose it, delete the account and create a new one.
      </p>
      <label htmlFor="new-token">Token</label>
      <div className="token-row">
        <input
          id="new-token"
          ref={field}
          readOnly
          value={token}
          className="mono"
          onFocus={(e) => e.target.select()}
          spellCheck={false}
        />
        <button type="button" className="primary" onClick={copy}>
          Copy
        </button>
      </div>
      <p className="help" role="status">
        {copied}
      </p>
      <button type="button" onClick={onDone}>
        I have stored it
      </button>
    </section>
  );
}
