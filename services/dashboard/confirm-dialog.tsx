// A modal confirmation on the native <dialog>: focus moves into it, Escape
// closes it, and the page behind cannot be reached until it is answered.
import { useEffect, useRef, type ReactNode } from "react";

export function ConfirmDialog(props: {
  title: string;
  children: ReactNode;
  confirmLabel: string;
  busy: boolean;
  onConfirm: () => void;
  onCancel: () => void;
}) {
  const ref = useRef<HTMLDialogElement>(null);
  useEffect(() => {
    const dialog = ref.current;
    if (dialog && !dialog.open) dialog.showModal();
    return () => dialog?.close();
  }, []);
  return (
    <dialog
      ref={ref}
      className="confirm"
      aria-labelledby="confirm-title"
      onCancel={(e) => {
        e.preventDefault();
        if (!props.busy) props.onCancel();
      }}
    >
      <h2 id="confirm-title">{props.title}</h2>
      {props.children}
      <div className="actions">
        <button type="button" onClick={props.onCancel} disabled={props.busy} autoFocus>
          Cancel
        </button>
        <button type="button" className="danger" onClick={props.onConfirm} disabled={props.busy}>
          {props.busy ? "Working…" : props.confirmLabel}
        </button>
      </div>
    </dialog>
  );
}
