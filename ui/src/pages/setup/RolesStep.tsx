// Step 1: what this node runs.
import { Alert, Card } from '../../components/common';
import type { RoleChoice } from './state';

const ROLE_OPTIONS: { value: RoleChoice; title: string; text: string }[] = [
  {
    value: 'both',
    title: 'Proxy and worker',
    text: "Clients connect here and this machine's model servers answer them. Other GPU boxes can join.",
  },
  {
    value: 'proxy',
    title: 'Proxy only',
    text: 'Clients and workers connect here; no model runs on this machine (a server or a small box).',
  },
  {
    value: 'worker',
    title: 'Worker only',
    text: "Serve this machine's model servers through a proxy that runs on another box.",
  },
];

export function RolesStep({
  choice,
  onChoose,
  error,
  saving,
  ready,
  onNext,
}: {
  choice: RoleChoice;
  onChoose: (choice: RoleChoice) => void;
  error: string | null;
  saving: boolean;
  ready: boolean;
  onNext: () => void;
}) {
  return (
    <Card title="What should this node do?" testid="setup-step-roles">
      <fieldset class="role-options">
        <legend class="sr-only">Roles</legend>
        {ROLE_OPTIONS.map((o) => (
          <label key={o.value} class={`role-option ${choice === o.value ? 'selected' : ''}`}>
            <input
              type="radio"
              name="roles"
              value={o.value}
              checked={choice === o.value}
              onChange={() => onChoose(o.value)}
              aria-describedby={`role-${o.value}-text`}
            />
            <span>
              <strong>{o.title}</strong>
              <span id={`role-${o.value}-text`} class="muted small">
                {o.text}
              </span>
            </span>
          </label>
        ))}
      </fieldset>
      {error ? <Alert kind="error">Could not save the roles: {error}</Alert> : null}
      <div class="row-end">
        <button type="button" class="btn btn-primary" onClick={onNext} disabled={saving || !ready}>
          {saving ? 'Saving…' : 'Next'}
        </button>
      </div>
    </Card>
  );
}
