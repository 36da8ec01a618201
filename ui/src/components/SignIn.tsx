import { useState } from 'preact/hooks';
import { TokenField } from './TokenField';
import { errorMessage, signIn } from '../api';

/**
 * Shown when the relay refused a request for want of a sign-in. Being on the same machine is
 * not a login (any local user or app is too), so secrets and changes need a session: the
 * documented ways open the dashboard signed in already; pasting the admin token here does the
 * same (the relay sets the session cookie; this page forgets the token at once).
 */
export function SignIn({ onSignedIn }: { onSignedIn: () => void }) {
  const [value, setValue] = useState('');
  const [error, setError] = useState<string | null>(null);
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
      if (await signIn(candidate)) {
        setValue('');
        onSignedIn();
      } else {
        setError('That admin token was refused. Check it and try again.');
      }
    } catch (err) {
      setError(errorMessage(err));
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
        aria-labelledby="sign-in-title"
        onSubmit={submit}
        data-testid="token-prompt"
      >
        <h2 id="sign-in-title">Sign in to this relay</h2>
        <p class="muted">
          The dashboard shows secrets (the join code, keys) and changes what this node runs, so it needs you signed
          in — even on this computer, where other users and apps can reach it too.
        </p>
        <ul class="muted sign-in-ways">
          <li>
            On the computer running ModelRelay, run <code>modelrelay dashboard</code>: it opens this page signed in.
          </li>
          <li>
            In the desktop app, use <strong>Open dashboard</strong> in the tray menu.
          </li>
          <li>
            Or paste the admin token: the one configured with <code>MODELRELAY_ADMIN_TOKEN</code>, or the one in the{' '}
            <code>admin-token</code> file of the relay's data directory (the start-up banner says where).
          </li>
        </ul>
        <TokenField value={value} onChange={setValue} />
        {error ? (
          <div class="alert alert-error" role="alert" data-testid="token-error">
            {error}
          </div>
        ) : null}
        <div class="row-end">
          <button class="btn btn-primary" type="submit" disabled={busy}>
            {busy ? 'Signing in…' : 'Sign in'}
          </button>
        </div>
      </form>
    </div>
  );
}
