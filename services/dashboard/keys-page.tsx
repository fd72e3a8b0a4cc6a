// API Keys (spec 5.2): service accounts of a project. A new account's token
// is shown once, here, and never again: skiff does not keep it, and this page
// holds it only in memory until you leave it.
import { useId, useState, type FormEvent } from "react";
import { timestampFromDate } from "@bufbuild/protobuf/wkt";
import type { ServiceAccount } from "../../gen/skiff/management/v2/management_pb.js";
import { describeError } from "./api.js";
import { ConfirmDialog } from "./confirm-dialog.js";
import { dateOf, formatDate, formatRelative, formatTime } from "./format.js";
import { Empty, ErrorNotice, FormError, Loading } from "./notices.js";
import { useSession } from "./session-context.js";
import { TokenOnce } from "./token-once.js";
import { useLoad } from "./use-load.js";

const DAY_MS = 86_400_000;
/** skiff accepts expiries up to 366 days ahead; a date input picks whole days. */
const MAX_DAYS = 365;
const DEFAULT_DAYS = 90;

const isoDay = (d: Date) =>
  `${d.getFullYear()}-${String(d.getMonth() + 1).padStart(2, "0")}-${String(d.getDate()).padStart(2, "0")}`;
const daysAhead = (n: number) => isoDay(new Date(Date.now() + n * DAY_MS));

function Practices() {
  return (
    <aside className="card practices" aria-labelledby="practices-title">
      <h2 id="practices-title">Recommended practices</h2>
      <ul>
        <li>
          <strong>One service account per environment</strong> (development, staging, production), so revoking one
          leaves the others working.
        </li>
        <li>
          <strong>Store tokens as secrets</strong> in your secret manager or CI secrets, never in plain configuration.
        </li>
        <li>
          <strong>Set an expiry date and rotate tokens</strong>: create the new account before the old one expires,
          switch over, then delete the old one.
        </li>
        <li>
          <strong>Never commit tokens to source control.</strong>
        </li>
      </ul>
    </aside>
  );
}

function CreateForm({
  project,
  onCreated,
}: {
  project: string;
  onCreated: (sa: ServiceAccount, token: string) => void;
}) {
  const { client } = useSession();
  const ids = { name: useId(), expiry: useId(), help: useId() };
  const [name, setName] = useState("");
  const [expiry, setExpiry] = useState(() => daysAhead(DEFAULT_DAYS));
  const [busy, setBusy] = useState(false);
  const [error, setError] = useState<string>();

  const submit = async (e: FormEvent) => {
    e.preventDefault();
    // The account stays valid through the whole chosen day, local time.
    const expiresAt = new Date(`${expiry}T23:59:59`);
    if (Number.isNaN(expiresAt.getTime())) {
      setError("Choose an expiry date.");
      return;
    }
    setBusy(true);
    setError(undefined);
    try {
      const res = await client.createServiceAccount({
        projectId: project,
        name: name.trim(),
        expiresAt: timestampFromDate(expiresAt),
      });
      onCreated(res.serviceAccount!, res.token);
      setName("");
    } catch (err) {
      setError(describeError(err));
    } finally {
      setBusy(false);
    }
  };

  return (
    <form className="card create-key" onSubmit={submit} aria-labelledby="create-title">
      <h2 id="create-title">Create a service account</h2>
      <label htmlFor={ids.name}>Name</label>
      <input
        id={ids.name}
        name="name"
        required
        maxLength={64}
        value={name}
        onChange={(e) => setName(e.target.value)}
        placeholder="e.g. ci-production"
        autoComplete="off"
      />
      <label htmlFor={ids.expiry}>Expiry date</label>
      <input
        id={ids.expiry}
        name="expiry"
        type="date"
        required
        min={daysAhead(1)}
        max={daysAhead(MAX_DAYS)}
        value={expiry}
        onChange={(e) => setExpiry(e.target.value)}
        aria-describedby={ids.help}
      />
      <p id={ids.help} className="help">
        The token stops working at the end of that day; at most a year ahead.
      </p>
      <FormError message={error} />
      <button type="submit" className="primary" disabled={busy}>
        {busy ? "Creating…" : "Create service account"}
      </button>
    </form>
  );
}

function AccountRow({ sa, onDelete }: { sa: ServiceAccount; onDelete: () => void }) {
  const expires = dateOf(sa.expiresAt);
  const expired = expires !== undefined && expires.getTime() <= Date.now();
  return (
    <tr className={expired ? "row-expired" : undefined}>
      <td data-label="Name">{sa.name}</td>
      <td className="mono" data-label="ID">
        {sa.serviceAccountId}
      </td>
      <td data-label="Created">{formatDate(dateOf(sa.createdAt))}</td>
      <td data-label="Expires">
        <time dateTime={expires?.toISOString()} title={formatTime(expires)}>
          {formatDate(expires)}
        </time>{" "}
        {expired ? (
          <span className="badge expired">expired</span>
        ) : (
          <span className="muted">{formatRelative(expires)}</span>
        )}
      </td>
      <td className="actions">
        <button type="button" className="danger" onClick={onDelete} aria-label={`Delete service account ${sa.name}`}>
          Delete
        </button>
      </td>
    </tr>
  );
}

export function KeysPage({ project }: { project: string }) {
  const { client, identity, signOut } = useSession();
  const accounts = useLoad((signal) => client.listServiceAccounts({ projectId: project }, { signal }), [project]);
  const [created, setCreated] = useState<{ sa: ServiceAccount; token: string }>();
  const [deleting, setDeleting] = useState<ServiceAccount>();
  const [busy, setBusy] = useState(false);
  const [deleteError, setDeleteError] = useState<string>();
  const [deleted, setDeleted] = useState<{ id: string; text: string }>();

  const confirmDelete = async () => {
    if (!deleting) return;
    setBusy(true);
    setDeleteError(undefined);
    try {
      await client.deleteServiceAccount({ projectId: project, serviceAccountId: deleting.serviceAccountId });
      if (identity.kind === "service_account" && identity.serviceAccountId === deleting.serviceAccountId)
        return signOut();
      setDeleted({
        id: deleting.serviceAccountId,
        text: `Service account ${deleting.name} (${deleting.serviceAccountId}) was deleted; its token no longer works.`,
      });
      if (created?.sa.serviceAccountId === deleting.serviceAccountId) setCreated(undefined);
      setDeleting(undefined);
      accounts.reload();
    } catch (err) {
      setDeleteError(describeError(err));
    } finally {
      setBusy(false);
    }
  };

  // The deleted account leaves the list at once, not when the reload comes back.
  const list = accounts.data?.serviceAccounts.filter((sa) => sa.serviceAccountId !== deleted?.id);
  return (
    <main className="page">
      <h1>API Keys</h1>
      <p className="lead">
        Service accounts of project <code>{project}</code>. Each one has one token, for{" "}
        <code>Authorization: Bearer &lt;token&gt;</code> on the API.
      </p>
      <div className="keys-layout">
        <div>
          {created && <TokenOnce name={created.sa.name} token={created.token} onDone={() => setCreated(undefined)} />}
          <CreateForm
            project={project}
            onCreated={(sa, token) => {
              setCreated({ sa, token });
              setDeleted(undefined);
              accounts.reload();
            }}
          />
        </div>
        <Practices />
      </div>
      <h2>Service accounts</h2>
      {deleted && (
        <p className="notice ok" role="status">
          {deleted.text}
        </p>
      )}
      {accounts.error !== undefined && (
        <ErrorNotice error={accounts.error} retry={accounts.reload} what="the service accounts" />
      )}
      {list === undefined ? (
        accounts.error === undefined && <Loading what="service accounts" />
      ) : list.length === 0 ? (
        <Empty title="No service accounts yet.">
          <p>Create one with the form above; its token is shown once.</p>
        </Empty>
      ) : (
        <div className="table-wrap">
          <table className="accounts stack">
            <caption className="sr-only">Service accounts of {project}</caption>
            <thead>
              <tr>
                <th scope="col">Name</th>
                <th scope="col">ID</th>
                <th scope="col">Created</th>
                <th scope="col">Expires</th>
                <th scope="col">
                  <span className="sr-only">Actions</span>
                </th>
              </tr>
            </thead>
            <tbody>
              {list.map((sa) => (
                <AccountRow
                  key={sa.serviceAccountId}
                  sa={sa}
                  onDelete={() => (setDeleteError(undefined), setDeleting(sa))}
                />
              ))}
            </tbody>
          </table>
        </div>
      )}
      {deleting && (
        <ConfirmDialog
          title={`Delete ${deleting.name}?`}
          confirmLabel="Delete service account"
          busy={busy}
          onConfirm={confirmDelete}
          onCancel={() => setDeleting(undefined)}
        >
          <p>
            Service account <code>{deleting.serviceAccountId}</code> and its token stop working at once, everywhere.
            This cannot be undone.
          </p>
          {identity.kind === "service_account" && identity.serviceAccountId === deleting.serviceAccountId && (
            <p className="notice warn">This is the account you are signed in with: you will be signed out.</p>
          )}
          <FormError message={deleteError} />
        </ConfirmDialog>
      )}
    </main>
  );
}
