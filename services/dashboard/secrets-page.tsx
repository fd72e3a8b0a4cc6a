// Secrets: a project's environment variables for its apps' replicas. A value
// is written here and never shown again: skiff answers names and times only,
// and this page drops the value from memory once it is saved.
import { useId, useState, type FormEvent } from "react";
import type { Secret } from "../../gen/skiff/management/v2/management_pb.js";
import { describeError } from "./api.js";
import { ConfirmDialog } from "./confirm-dialog.js";
import { dateOf, formatDate, formatRelative, formatTime } from "./format.js";
import { Empty, ErrorNotice, FormError, Loading } from "./notices.js";
import { useSession } from "./session-context.js";
import { useLoad } from "./use-load.js";

/** As skiff checks it (services/secrets/names.ts); the server's answer is the final word. */
const NAME_PATTERN = "[A-Za-z_][A-Za-z0-9_]*";

function SetForm({
  project,
  name,
  setName,
  onSaved,
}: {
  project: string;
  name: string;
  setName: (name: string) => void;
  onSaved: (text: string) => void;
}) {
  const { client } = useSession();
  const ids = { name: useId(), value: useId(), help: useId() };
  const [value, setValue] = useState("");
  const [busy, setBusy] = useState(false);
  const [error, setError] = useState<string>();

  const submit = async (e: FormEvent) => {
    e.preventDefault();
    setBusy(true);
    setError(undefined);
    try {
      const res = await client.setSecret({ projectId: project, name: name.trim(), value });
      onSaved(
        `Secret ${res.secret!.name} was ${res.created ? "created" : "updated"}; the project's replicas are being replaced to see it.`,
      );
      setName("");
      setValue("");
    } catch (err) {
      setError(describeError(err));
    } finally {
      setBusy(false);
    }
  };

  return (
    <form className="card create-key" onSubmit={submit} aria-labelledby="secret-form-title">
      <h2 id="secret-form-title">Set a secret</h2>
      <label htmlFor={ids.name}>Name</label>
      <input
        id={ids.name}
        name="name"
        required
        maxLength={128}
        pattern={NAME_PATTERN}
        value={name}
        onChange={(e) => setName(e.target.value)}
        placeholder="e.g. HF_AUTH_TOKEN"
        autoComplete="off"
        spellCheck={false}
        aria-describedby={ids.help}
      />
      <label htmlFor={ids.value}>Value</label>
      <textarea
        id={ids.value}
        name="value"
        rows={3}
        value={value}
        onChange={(e) => setValue(e.target.value)}
        autoComplete="off"
        spellCheck={false}
      />
      <p id={ids.help} className="help">
        An environment variable name (letters, digits and _, not starting with a digit; not PORT, PATH, HOME, LANG or
        SKIFF_…). A name that exists gets the new value. The value is never shown again.
      </p>
      <FormError message={error} />
      <button type="submit" className="primary" disabled={busy}>
        {busy ? "Saving…" : "Save secret"}
      </button>
    </form>
  );
}

function SecretRow({ secret, onReplace, onDelete }: { secret: Secret; onReplace: () => void; onDelete: () => void }) {
  const updated = dateOf(secret.updatedAt);
  return (
    <tr>
      <td className="mono" data-label="Name">
        {secret.name}
      </td>
      <td data-label="Created">{formatDate(dateOf(secret.createdAt))}</td>
      <td data-label="Updated">
        <time dateTime={updated?.toISOString()} title={formatTime(updated)}>
          {formatRelative(updated)}
        </time>
      </td>
      <td className="actions">
        <button type="button" onClick={onReplace} aria-label={`Replace the value of ${secret.name}`}>
          Replace value
        </button>{" "}
        <button type="button" className="danger" onClick={onDelete} aria-label={`Delete secret ${secret.name}`}>
          Delete
        </button>
      </td>
    </tr>
  );
}

export function SecretsPage({ project }: { project: string }) {
  const { client } = useSession();
  const secrets = useLoad((signal) => client.listSecrets({ projectId: project }, { signal }), [project]);
  const [name, setName] = useState("");
  const [notice, setNotice] = useState<string>();
  const [deleting, setDeleting] = useState<Secret>();
  const [busy, setBusy] = useState(false);
  const [deleteError, setDeleteError] = useState<string>();
  const [deleted, setDeleted] = useState<string>();

  const confirmDelete = async () => {
    if (!deleting) return;
    setBusy(true);
    setDeleteError(undefined);
    try {
      await client.deleteSecret({ projectId: project, name: deleting.name });
      setDeleted(deleting.name);
      setNotice(`Secret ${deleting.name} was deleted; the project's replicas are being replaced without it.`);
      setDeleting(undefined);
      secrets.reload();
    } catch (err) {
      setDeleteError(describeError(err));
    } finally {
      setBusy(false);
    }
  };

  // The deleted secret leaves the list at once, not when the reload comes back.
  const list = secrets.data?.secrets.filter((s) => s.name !== deleted);
  return (
    <main className="page">
      <h1>Secrets</h1>
      <p className="lead">
        Environment variables of every replica of project <code>{project}</code>&apos;s apps, read as{" "}
        <code>os.environ.get(&quot;NAME&quot;)</code> or <code>process.env.NAME</code>. An app&apos;s own{" "}
        <code>[env]</code> wins over a secret of the same name.
      </p>
      <SetForm
        project={project}
        name={name}
        setName={setName}
        onSaved={(text) => {
          setNotice(text);
          setDeleted(undefined);
          secrets.reload();
        }}
      />
      <h2>Secrets of {project}</h2>
      {notice && (
        <p className="notice ok" role="status">
          {notice}
        </p>
      )}
      {secrets.error !== undefined && <ErrorNotice error={secrets.error} retry={secrets.reload} what="the secrets" />}
      {list === undefined ? (
        secrets.error === undefined && <Loading what="secrets" />
      ) : list.length === 0 ? (
        <Empty title="No secrets yet.">
          <p>Set one with the form above.</p>
        </Empty>
      ) : (
        <div className="table-wrap">
          <table className="secrets stack">
            <caption className="sr-only">Secrets of {project}</caption>
            <thead>
              <tr>
                <th scope="col">Name</th>
                <th scope="col">Created</th>
                <th scope="col">Updated</th>
                <th scope="col">
                  <span className="sr-only">Actions</span>
                </th>
              </tr>
            </thead>
            <tbody>
              {list.map((s) => (
                <SecretRow
                  key={s.name}
                  secret={s}
                  onReplace={() => setName(s.name)}
                  onDelete={() => (setDeleteError(undefined), setDeleting(s))}
                />
              ))}
            </tbody>
          </table>
        </div>
      )}
      {deleting && (
        <ConfirmDialog
          title={`Delete ${deleting.name}?`}
          confirmLabel="Delete secret"
          busy={busy}
          onConfirm={confirmDelete}
          onCancel={() => setDeleting(undefined)}
        >
          <p>
            The project&apos;s replicas are replaced without <code>{deleting.name}</code>. This cannot be undone.
          </p>
          <FormError message={deleteError} />
        </ConfirmDialog>
      )}
    </main>
  );
}
