// The form that creates a key: a name, and optional limits (which models, how many requests at
// once, how many per minute).
import { useState } from 'preact/hooks';
import { api, errorMessage } from '../../api';
import { Alert, Card, Field } from '../../components/common';
import { EMPTY_KEY_FORM, parseModelList, toggleModel, validateKeyForm, type KeyForm, type KeyFormErrors } from '../../lib/keys';
import type { CreatedApiKey } from '../../types';

export function CreateKeyCard({ servedModels, onCreated }: { servedModels: string[]; onCreated: (key: CreatedApiKey) => void }) {
  const [form, setForm] = useState<KeyForm>(EMPTY_KEY_FORM);
  const [errors, setErrors] = useState<KeyFormErrors>({});
  const [serverError, setServerError] = useState<string | null>(null);
  const [saving, setSaving] = useState(false);

  const set = (field: keyof KeyForm, value: string) => {
    setForm((f) => ({ ...f, [field]: value }));
    // The error of a field goes away as soon as it is edited; the others stay.
    setErrors((e) => ({ ...e, [field]: undefined }));
  };

  const submit = async (e: Event) => {
    e.preventDefault();
    setServerError(null);
    const { body, errors: found } = validateKeyForm(form);
    setErrors(found);
    if (!body) return;
    setSaving(true);
    try {
      const created = await api.createKey(body);
      setForm(EMPTY_KEY_FORM);
      onCreated(created);
    } catch (err) {
      setServerError(errorMessage(err));
    } finally {
      setSaving(false);
    }
  };

  const chosen = parseModelList(form.models);
  const input = (field: keyof KeyForm, opts: { placeholder?: string; numeric?: boolean; required?: boolean } = {}) => (
    <input
      id={`key-${field}`}
      type="text"
      value={form[field]}
      placeholder={opts.placeholder}
      inputMode={opts.numeric ? 'numeric' : undefined}
      autocomplete="off"
      required={opts.required}
      aria-invalid={errors[field] ? 'true' : undefined}
      aria-describedby={`key-${field}-help`}
      onInput={(ev) => set(field, (ev.target as HTMLInputElement).value)}
      data-testid={`key-${field}`}
    />
  );

  return (
    <Card title="Create a key" testid="create-key">
      <form onSubmit={submit} noValidate>
        <Field label="Name" id="key-name" error={errors.name} help="Who or what uses it: shown in the list and in usage.">
          {input('name', { placeholder: 'production-app', required: true })}
        </Field>
        <Field
          label="Allowed models (optional)"
          id="key-models"
          error={errors.models}
          help="Separated by commas; empty allows every model."
        >
          {input('models', { placeholder: 'every model' })}
        </Field>
        {servedModels.length ? (
          <div class="chips" role="group" aria-label="Served models">
            {servedModels.map((m) => (
              <button
                key={m}
                type="button"
                class="chip"
                aria-pressed={chosen.includes(m)}
                onClick={() => set('models', toggleModel(form.models, m))}
              >
                {m}
              </button>
            ))}
          </div>
        ) : null}
        <div class="form-grid">
          <Field
            label="Concurrent requests (optional)"
            id="key-maxConcurrent"
            error={errors.maxConcurrent}
            help="At most this many at once; empty for no limit."
          >
            {input('maxConcurrent', { placeholder: 'no limit', numeric: true })}
          </Field>
          <Field
            label="Requests per minute (optional)"
            id="key-requestsPerMinute"
            error={errors.requestsPerMinute}
            help="Requests beyond this in a minute are refused; empty for no limit."
          >
            {input('requestsPerMinute', { placeholder: 'no limit', numeric: true })}
          </Field>
          <Field
            label="Weight (optional)"
            id="key-weight"
            error={errors.weight}
            help="When slots are busy, this key takes this many turns for each turn of another key of its priority (1 to 16); empty for 1."
          >
            {input('weight', { placeholder: '1', numeric: true })}
          </Field>
        </div>
        <Field
          label="Priority"
          id="key-priority"
          help="When every slot is busy, batch requests wait behind interactive ones (they still get at least one turn in nine). Requests may lower themselves with x-modelrelay-priority: batch, never raise."
        >
          <select
            id="key-priority"
            value={form.priority}
            onChange={(ev) => set('priority', (ev.target as HTMLSelectElement).value)}
            aria-describedby="key-priority-help"
            data-testid="key-priority"
          >
            <option value="interactive">Interactive: a person waits for the answers</option>
            <option value="batch">Batch: agents, evaluations, bulk jobs</option>
          </select>
        </Field>
        {serverError ? (
          <Alert kind="error" testid="create-key-error">
            Could not create the key: {serverError}
          </Alert>
        ) : null}
        <div class="row-end">
          <button type="submit" class="btn btn-primary" disabled={saving} data-testid="create-key-submit">
            {saving ? 'Creating…' : 'Create key'}
          </button>
        </div>
      </form>
    </Card>
  );
}
