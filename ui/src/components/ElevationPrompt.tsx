import { useState } from 'preact/hooks';
import { TokenField } from './TokenField';

/**
 * Asks for the admin token when a change alters what the node runs, where it sends secrets, or
 * (while keys are required) who holds an API key.
 * Those changes need the token even on this machine, so a web page the user visits can never
 * make them. The relay's message names the settings and where the token file is.
 */
export function ElevationPrompt({
  message,
  onSubmit,
  onCancel,
}: {
  message: string;
  onSubmit: (token: string) => void;
  onCancel: () => void;
}) {
  const [value, setValue] = useState('');

  const submit = (e: Event) => {
    e.preventDefault();
    const candidate = value.trim();
    if (candidate) onSubmit(candidate);
  };

  return (
    <div class="overlay">
      <form
        class="dialog card"
        role="dialog"
        aria-modal="true"
        aria-labelledby="elevation-title"
        onSubmit={submit}
        data-testid="elevation-prompt"
      >
        <h2 id="elevation-title">This change needs the admin token</h2>
        <p class="muted">
          Changes that choose which programs this node starts, where it sends secrets, or (while keys are required) who
          holds an API key, are protected by the admin token even on this machine, so that no web page you visit can
          make them.
        </p>
        <div class="alert alert-info" data-testid="elevation-message">
          {message}
        </div>
        <TokenField value={value} onChange={setValue} />
        <div class="row-end">
          <button class="btn" type="button" onClick={onCancel}>
            Cancel
          </button>
          <button class="btn btn-primary" type="submit" disabled={!value.trim()}>
            Save with token
          </button>
        </div>
      </form>
    </div>
  );
}
