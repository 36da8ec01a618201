import { useEffect, useState } from 'preact/hooks';
import { api, errorMessage } from '../api';
import { Alert, Card, Field, Spinner } from '../components/common';
import { useLive } from '../live';
import { rolesLabel } from '../lib/viewmodel';
import {
  buildPatch,
  fieldOfMessage,
  newAliasRow,
  toForm,
  type FieldErrors,
  type SettingsForm,
} from '../lib/settingsForm';
import type { NodeInfo, SettingsResponse } from '../types';

type Msg = { kind: 'error' | 'success' | 'info'; text: string } | null;

export function Settings() {
  const live = useLive();
  const [data, setData] = useState<SettingsResponse | null>(null);
  const [form, setForm] = useState<SettingsForm | null>(null);
  const [loadError, setLoadError] = useState<string | null>(null);
  const [errors, setErrors] = useState<FieldErrors>({});
  const [message, setMessage] = useState<Msg>(null);
  const [saving, setSaving] = useState(false);
  const [toml, setToml] = useState('');
  const [configMessage, setConfigMessage] = useState<Msg>(null);
  const [savingConfig, setSavingConfig] = useState(false);

  const apply = (s: SettingsResponse) => {
    setData(s);
    setForm(toForm(s.settings));
    setToml(s.toml);
  };

  useEffect(() => {
    api
      .settings()
      .then(apply)
      .catch((e) => setLoadError(errorMessage(e)));
  }, []);

  if (loadError) {
    return (
      <main class="page page-narrow" data-testid="settings">
        <h1>Settings</h1>
        <Alert kind="error">Could not read the settings: {loadError}</Alert>
      </main>
    );
  }
  if (!data || !form) {
    return (
      <main class="page page-narrow" data-testid="settings">
        <Spinner label="Reading the settings…" />
      </main>
    );
  }

  const set = <K extends keyof SettingsForm>(key: K, value: SettingsForm[K]) => {
    setForm({ ...form, [key]: value });
    if (errors[key]) setErrors({ ...errors, [key]: undefined });
  };

  const save = async (e: Event) => {
    e.preventDefault();
    setMessage(null);
    const { patch, errors: fieldErrors, changed } = buildPatch(data.settings, form);
    setErrors(fieldErrors);
    if (Object.values(fieldErrors).some(Boolean)) {
      setMessage({ kind: 'error', text: 'Fix the highlighted fields.' });
      return;
    }
    if (!changed) {
      setMessage({ kind: 'info', text: 'Nothing changed.' });
      return;
    }
    setSaving(true);
    try {
      const s = await api.saveSettings(patch);
      apply(s);
      setMessage({ kind: 'success', text: `Saved to ${s.path}.` });
    } catch (err) {
      const text = errorMessage(err);
      const field = fieldOfMessage(text);
      if (field) setErrors({ [field]: text });
      setMessage({ kind: 'error', text });
    } finally {
      setSaving(false);
    }
  };

  const saveConfig = async (e: Event) => {
    e.preventDefault();
    setConfigMessage(null);
    setSavingConfig(true);
    try {
      const s = await api.saveConfig(toml);
      apply(s);
      setErrors({});
      setMessage(null);
      setConfigMessage({ kind: 'success', text: `Saved to ${s.path}.` });
    } catch (err) {
      setConfigMessage({ kind: 'error', text: errorMessage(err) });
    } finally {
      setSavingConfig(false);
    }
  };

  const text = (key: keyof SettingsForm, label: string, opts: { placeholder?: string; help?: string; type?: string } = {}) => (
    <Field label={label} error={errors[key]} help={opts.help} id={`f-${key}`}>
      <input
        id={`f-${key}`}
        type={opts.type === 'number' ? 'text' : (opts.type ?? 'text')}
        value={form[key] as string}
        placeholder={opts.placeholder}
        inputMode={opts.type === 'number' ? 'numeric' : undefined}
        autocomplete="off"
        aria-invalid={errors[key] ? 'true' : undefined}
        aria-describedby={errors[key] || opts.help ? `f-${key}-help` : undefined}
        onInput={(ev) => set(key, (ev.target as HTMLInputElement).value as never)}
        data-testid={`field-${key}`}
      />
    </Field>
  );

  return (
    <main class="page page-narrow" data-testid="settings">
      <h1>Settings</h1>
      {data.restart_required.length ? (
        <Alert kind="warning" testid="restart-banner">
          Restart ModelRelay to apply: {data.restart_required.map((r) => <code key={r}>{r}</code>)}
        </Alert>
      ) : null}
      <RuntimeNotes data={data} node={live.status?.node ?? null} />
      <form onSubmit={save} noValidate aria-label="Settings" data-testid="settings-form">
        <Card title="Roles">
          <div class="checks">
            <label class="check">
              <input type="checkbox" checked={form.proxyRole} onChange={(e) => set('proxyRole', (e.target as HTMLInputElement).checked)} />
              <span>
                <strong>Proxy</strong> <span class="muted small">clients and workers connect to this node</span>
              </span>
            </label>
            <label class="check">
              <input type="checkbox" checked={form.workerRole} onChange={(e) => set('workerRole', (e.target as HTMLInputElement).checked)} />
              <span>
                <strong>Worker</strong> <span class="muted small">this machine's model servers answer requests</span>
              </span>
            </label>
          </div>
          <StartOnLogin />
        </Card>

        <Card title="Proxy">
          <div class="form-grid">
            {text('listen', 'Listen address', { placeholder: '127.0.0.1:8080', help: 'Takes effect after a restart. Use 0.0.0.0:PORT to let other machines connect.' })}
            {text('provider', 'Provider', { placeholder: 'local' })}
            {text('maxQueueLen', 'Max queue length', { type: 'number', help: 'Queued requests per provider before new ones get 429.' })}
            {text('queueTimeoutSecs', 'Queue timeout (seconds)', { type: 'number' })}
            {text('requestTimeoutSecs', 'Request timeout (seconds)', { type: 'number' })}
            {text('defaultModel', 'Default model', { placeholder: 'none', help: 'Serves requests for models nobody serves.' })}
          </div>
          <AliasesEditor form={form} set={set} error={errors.aliases} />
        </Card>

        <Card title="Worker">
          <div class="form-grid">
            {text('proxyUrl', 'Proxy URL', { placeholder: "this node's own proxy", type: 'url' })}
            <Field
              label="Worker secret"
              id="f-workerSecret"
              error={errors.workerSecret}
              help={data.settings.worker.worker_secret_set ? 'A secret is set; leave empty to keep it.' : 'No secret set.'}
            >
              <input
                id="f-workerSecret"
                type="password"
                autocomplete="new-password"
                value={form.workerSecret}
                placeholder={data.settings.worker.worker_secret_set ? '•••••••• (unchanged)' : ''}
                aria-describedby="f-workerSecret-help"
                onInput={(ev) => set('workerSecret', (ev.target as HTMLInputElement).value)}
                data-testid="field-workerSecret"
              />
            </Field>
            {text('workerName', 'Worker name', { placeholder: 'the host name' })}
            {text('backendUrl', 'Backend URL', { placeholder: 'every model server found here', help: 'Comma-separate several.' })}
            {text('models', 'Models', { placeholder: 'all the backend serves', help: 'Comma-separated; empty asks the backend.' })}
            {text('maxConcurrency', 'Max concurrency', { type: 'number', help: "Requests at once; match the backend's parallel slots." })}
          </div>
        </Card>

        <div class="save-bar">
          {message ? (
            <Alert kind={message.kind} testid={message.kind === 'error' ? 'settings-error' : 'settings-message'}>
              {message.text}
            </Alert>
          ) : null}
          <div class="row-end">
            <button type="button" class="btn" onClick={() => { setForm(toForm(data.settings)); setErrors({}); setMessage(null); }}>
              Revert
            </button>
            <button type="submit" class="btn btn-primary" disabled={saving} data-testid="settings-save">
              {saving ? 'Saving…' : 'Save settings'}
            </button>
          </div>
        </div>
      </form>

      <details class="card advanced" data-testid="advanced-config">
        <summary>
          <h2>Advanced: config file</h2>
        </summary>
        <form onSubmit={saveConfig} aria-label="Config file">
          <p class="muted small">
            Everything the form does not show (upstreams, model map, lifecycle, …). File: <code data-testid="config-path">{data.path}</code>
          </p>
          <label class="field">
            <span>Config file (TOML)</span>
            <textarea
              rows={16}
              spellcheck={false}
              value={toml}
              onInput={(e) => setToml((e.target as HTMLTextAreaElement).value)}
              data-testid="config-toml"
            />
          </label>
          {configMessage ? (
            <Alert kind={configMessage.kind} testid={configMessage.kind === 'error' ? 'config-error' : 'config-message'}>
              {configMessage.kind === 'error' ? <pre class="error-text">{configMessage.text}</pre> : configMessage.text}
            </Alert>
          ) : null}
          <div class="row-end">
            <button type="button" class="btn" onClick={() => setToml(data.toml)}>
              Revert
            </button>
            <button type="submit" class="btn btn-primary" disabled={savingConfig} data-testid="config-save">
              {savingConfig ? 'Saving…' : 'Save config file'}
            </button>
          </div>
        </form>
      </details>
    </main>
  );
}

function AliasesEditor({
  form,
  set,
  error,
}: {
  form: SettingsForm;
  set: <K extends keyof SettingsForm>(key: K, value: SettingsForm[K]) => void;
  error?: string;
}) {
  const rows = form.aliases;
  const update = (key: number, patch: Partial<{ pattern: string; model: string }>) =>
    set(
      'aliases',
      rows.map((r) => (r.key === key ? { ...r, ...patch } : r)),
    );
  return (
    <fieldset class="aliases" data-testid="aliases">
      <legend>Model aliases</legend>
      <p class="muted small">
        A client-facing name or glob pattern (<code>claude-*</code>) and the served model it maps to.
      </p>
      {rows.length === 0 ? <p class="empty small">No alias.</p> : null}
      {rows.map((r, i) => (
        <div class="alias-row" key={r.key} data-testid="alias-row">
          <input
            type="text"
            aria-label={`Alias ${i + 1} name or pattern`}
            placeholder="claude-*"
            value={r.pattern}
            onInput={(e) => update(r.key, { pattern: (e.target as HTMLInputElement).value })}
          />
          <span aria-hidden="true">→</span>
          <input
            type="text"
            aria-label={`Alias ${i + 1} model`}
            placeholder="qwen2.5-coder"
            value={r.model}
            onInput={(e) => update(r.key, { model: (e.target as HTMLInputElement).value })}
          />
          <button
            type="button"
            class="btn btn-small"
            aria-label={`Remove alias ${i + 1}`}
            onClick={() => set('aliases', rows.filter((x) => x.key !== r.key))}
          >
            Remove
          </button>
        </div>
      ))}
      {error ? (
        <span class="field-error" role="alert">
          {error}
        </span>
      ) : null}
      <button type="button" class="btn btn-small" onClick={() => set('aliases', [...rows, newAliasRow()])} data-testid="alias-add">
        Add alias
      </button>
    </fieldset>
  );
}

/** Desktop app only (its node serves the entry): start ModelRelay when the user logs in. */
function StartOnLogin() {
  const [available, setAvailable] = useState(false);
  const [enabled, setEnabled] = useState<boolean | null>(null);
  const [error, setError] = useState<string | null>(null);
  useEffect(() => {
    api
      .startOnLogin()
      .then((state) => {
        setAvailable(state.available);
        setEnabled(state.enabled);
        if (state.error) setError(state.error);
      })
      .catch(() => setAvailable(false));
  }, []);
  if (!available) return null;
  const change = async (value: boolean) => {
    setError(null);
    try {
      setEnabled((await api.setStartOnLogin(value)).enabled);
    } catch (e) {
      setError(errorMessage(e));
    }
  };
  return (
    <div class="checks">
      <label class="check">
        <input
          type="checkbox"
          checked={!!enabled}
          disabled={enabled === null}
          onChange={(e) => change((e.target as HTMLInputElement).checked)}
          data-testid="start-on-login"
        />
        <span>
          <strong>Start on login</strong> <span class="muted small">open ModelRelay when you log in to this computer</span>
        </span>
      </label>
      {error ? <Alert kind="error">{error}</Alert> : null}
    </div>
  );
}

/**
 * Flags and environment variables win over the file: say so when what runs differs from what
 * the form (the file) shows, unless a restart is already pending for it.
 */
function RuntimeNotes({ data, node }: { data: SettingsResponse; node: NodeInfo | null }) {
  if (!node) return null;
  const notes: string[] = [];
  const s = data.settings;
  if ((node.roles.proxy !== s.roles.proxy || node.roles.worker !== s.roles.worker) && !data.restart_required.some((r) => r.startsWith('roles'))) {
    notes.push(`This node runs as ${rolesLabel(node.roles)} now (set when it was started).`);
  }
  if (node.roles.proxy && node.listen !== s.proxy.listen && !data.restart_required.includes('proxy.listen')) {
    notes.push(`It listens on ${node.listen} now (set by a command-line flag or environment variable).`);
  }
  if (!notes.length) return null;
  return (
    <Alert kind="info" testid="runtime-notes">
      {notes.join(' ')} Command-line flags and environment variables take precedence over this file.
    </Alert>
  );
}
