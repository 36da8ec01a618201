import { useState } from 'preact/hooks';
import { TokenField } from './TokenField';
import { checkToken, errorMessage, setToken } from '../api';

/** Asks for the admin token after the API answered 401; checks it before keeping it. */
export function TokenPrompt({ onAccepted, hadToken }: { onAccepted: () => void; hadToken: boolean }) {
  const [value, setValue] = useState('');
  const [error, setError] = useState<string | null>(hadToken ? 'The saved admin token was refused.' : null);
  const [busy, setBusy] = useState(false);

  const submit = async (e: Event) => {
    e.preventDefault();
    const candidate = value.trim();
    if (!candidate) {
      setError('Enter the admin token.');
      return;
    }
    setBusy(true);
    setError(null);
    try {
      if (await checkToken(candidate)) {
        setToken(candidate);
        onAccepted();
      } else {
        setError('That admin token was refused. Check it and try again.');
      }
    } catch (err) {
      setError(`Cannot reach the relay: ${errorMessage(err)}`);
    } finally {
      setBusy(false);
    }
  };

  return (
    <div class="overlay">
      <form
        class="dialog card"
        role="dialog"
        aria-modal="true"
        aria-labelledby="token-title"
        onSubmit={submit}
        data-testid="token-prompt"
      >
        <h2 id="token-title">Admin token required</h2>
        <p class="muted">
          This relay listens beyond this machine (or its owner set a token), so its control API needs the admin token.
          It is the one configured with <code>MODELRELAY_ADMIN_TOKEN</code>, or the one stored in the{' '}
          <code>admin-token</code> file of the relay's data directory (the start-up banner says where).
        </p>
        <TokenField value={value} onChange={setValue} />
        {error ? (
          <div class="alert alert-error" role="alert" data-testid="token-error">
            {error}
          </div>
        ) : null}
        <div class="row-end">
          <button class="btn btn-primary" type="submit" disabled={busy}>
            {busy ? 'Checking…' : 'Unlock'}
          </button>
        </div>
      </form>
    </div>
  );
}
