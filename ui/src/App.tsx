import { useEffect, useState } from 'preact/hooks';
import { api, initApi, onUnauthorized, errorMessage } from './api';
import { SignIn } from './components/SignIn';
import { Alert, Spinner } from './components/common';
import { navigate, useRoute, type Route } from './hash';
import { LiveContext, useLiveStatus, type Connection } from './live';
import { Dashboard } from './pages/Dashboard';
import { Keys } from './pages/Keys';
import { Settings } from './pages/Settings';
import { SETUP_DONE_KEY, Setup } from './pages/Setup';
import { Usage } from './pages/Usage';

function setupDismissed(): boolean {
  try {
    return localStorage.getItem(SETUP_DONE_KEY) === '1';
  } catch {
    return false;
  }
}

export function App() {
  const [ready, setReady] = useState(false);
  const [initError, setInitError] = useState<string | null>(null);
  const [needSignIn, setNeedSignIn] = useState(false);
  // Bumped when the person signs in: pages remount and fetch again, the feed reconnects.
  const [epoch, setEpoch] = useState(0);
  const route = useRoute();

  useEffect(() => {
    initApi()
      .then(() => setReady(true))
      .catch((e) => setInitError(errorMessage(e)));
    return onUnauthorized(() => setNeedSignIn(true));
  }, []);

  // No route in the address: first run (no config file yet) opens the setup wizard.
  useEffect(() => {
    if (!ready || route !== '') return;
    if (setupDismissed()) {
      navigate('dashboard');
      return;
    }
    let cancelled = false;
    api
      .settings()
      .then((s) => !cancelled && navigate(s.toml.trim() === '' ? 'setup' : 'dashboard'))
      .catch(() => !cancelled && navigate('dashboard'));
    return () => {
      cancelled = true;
    };
  }, [ready, route, epoch]);

  const live = useLiveStatus(ready && !needSignIn, epoch);

  if (initError) {
    return (
      <main class="page page-narrow">
        <Alert kind="error">Cannot find the relay: {initError}</Alert>
      </main>
    );
  }

  return (
    <LiveContext.Provider value={live}>
      <Nav route={route} connection={live.connection} />
      {!ready ? (
        <main class="page">
          <Spinner label="Starting…" />
        </main>
      ) : needSignIn ? null : route === 'setup' ? (
        <Setup key={`setup-${epoch}`} />
      ) : route === 'settings' ? (
        <Settings key={`settings-${epoch}`} />
      ) : route === 'dashboard' ? (
        <Dashboard key={`dashboard-${epoch}`} />
      ) : route === 'keys' ? (
        <Keys key={`keys-${epoch}`} />
      ) : route === 'usage' ? (
        <Usage key={`usage-${epoch}`} />
      ) : (
        <main class="page">
          <Spinner label="Loading…" />
        </main>
      )}
      {needSignIn ? (
        <SignIn
          onSignedIn={() => {
            setNeedSignIn(false);
            setEpoch((n) => n + 1);
          }}
        />
      ) : null}
    </LiveContext.Provider>
  );
}

const LINKS: { route: Exclude<Route, ''>; label: string }[] = [
  { route: 'dashboard', label: 'Dashboard' },
  { route: 'keys', label: 'Keys' },
  { route: 'usage', label: 'Usage' },
  { route: 'setup', label: 'Setup' },
  { route: 'settings', label: 'Settings' },
];

function Nav({ route, connection }: { route: string; connection: Connection }) {
  const label =
    connection === 'live'
      ? 'Live'
      : connection === 'reconnecting'
        ? 'Reconnecting…'
        : connection === 'unauthorized'
          ? 'Locked'
          : 'Connecting…';
  return (
    <header class="topbar">
      <a class="brand" href="#/dashboard">
        <span class="logo" aria-hidden="true" />
        ModelRelay
      </a>
      <nav aria-label="Main">
        {LINKS.map((l) => (
          <a key={l.route} href={`#/${l.route}`} aria-current={route === l.route ? 'page' : undefined}>
            {l.label}
          </a>
        ))}
      </nav>
      <span class={`conn conn-${connection}`} role="status" aria-live="polite" data-testid="connection-status" data-state={connection}>
        <span class="dot" aria-hidden="true" />
        {label}
      </span>
    </header>
  );
}
