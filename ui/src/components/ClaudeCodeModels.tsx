import { useState } from 'preact/hooks';
import { api, errorMessage } from '../api';
import { useLive } from '../live';
import { Alert } from './common';
import { ModelSelect } from './ModelSelect';

/**
 * Which served models Claude Code's requests go to: the relay chooses (the largest model for the
 * conversation, the smallest for its quick `claude-haiku-*` side requests), and the person may
 * pick others — saved as the aliases `claude-*` and `claude-haiku-*`, which always win.
 */
export function ClaudeCodeModels() {
  const live = useLive();
  const now = live.status?.node.claude_code;
  const served = Array.from(new Set((live.status?.models ?? []).map((m) => m.name))).sort();
  const [editing, setEditing] = useState(false);
  const [model, setModel] = useState('');
  const [small, setSmall] = useState('');
  const [busy, setBusy] = useState(false);
  const [error, setError] = useState<string | null>(null);
  const [saved, setSaved] = useState(false);

  if (!now) return null;

  const save = async () => {
    setBusy(true);
    setError(null);
    try {
      const current = await api.settings();
      const aliases = { ...current.settings.proxy.aliases, 'claude-*': model, 'claude-haiku-*': small || model };
      await api.saveSettings({ proxy: { aliases } });
      setEditing(false);
      setSaved(true);
    } catch (e) {
      setError(errorMessage(e));
    } finally {
      setBusy(false);
    }
  };

  return (
    <div class="claude-code" data-testid="claude-code-models">
      {now.model ? (
        <p>
          Claude Code uses <code data-testid="claude-code-model">{now.model}</code>
          {now.small_model && now.small_model !== now.model ? (
            <>
              {' '}
              and <code data-testid="claude-code-small-model">{now.small_model}</code> for its quick side requests
            </>
          ) : null}
          , with nothing but the relay URL (no <code>ANTHROPIC_MODEL</code> needed).{' '}
          {served.length && !editing ? (
            <button
              type="button"
              class="btn btn-small"
              onClick={() => {
                setModel(now.model ?? served[0]);
                setSmall(now.small_model ?? now.model ?? served[0]);
                setSaved(false);
                setEditing(true);
              }}
              data-testid="claude-code-change"
            >
              Change…
            </button>
          ) : null}
        </p>
      ) : (
        <p class="muted">Claude Code's requests wait until a worker serves a chat model.</p>
      )}
      {saved ? <p class="small muted">Saved as the aliases claude-* and claude-haiku-*.</p> : null}
      {editing ? (
        <div class="row-wrap">
          <ModelSelect label="Conversation" value={model} models={served} onChange={setModel} testid="claude-code-pick" />
          <ModelSelect
            label="Side requests (claude-haiku-*)"
            value={small}
            models={served}
            onChange={setSmall}
            testid="claude-code-pick-small"
          />
          <button type="button" class="btn btn-primary btn-small" onClick={save} disabled={busy || !model}>
            {busy ? 'Saving…' : 'Save'}
          </button>
          <button type="button" class="btn btn-small" onClick={() => setEditing(false)} disabled={busy}>
            Cancel
          </button>
        </div>
      ) : null}
      {error ? <Alert kind="error">{error}</Alert> : null}
    </div>
  );
}
