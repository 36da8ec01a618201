// The setup wizard: four steps (one file each under setup/), their shared state in one reducer
// (setup/state.ts).
import { useEffect, useReducer, useState } from 'preact/hooks';
import { api, errorMessage } from '../api';
import { Alert } from '../components/common';
import { navigate } from '../hash';
import { useLive } from '../live';
import type { SettingsResponse } from '../types';
import { BackendsStep } from './setup/BackendsStep';
import { ClientsStep } from './setup/ClientsStep';
import { ConnectStep } from './setup/ConnectStep';
import { RolesStep } from './setup/RolesStep';
import { STEPS, choiceFromRoles, initialWizard, markSetupDone, rolesFromChoice, wizard } from './setup/state';

export { SETUP_DONE_KEY } from './setup/state';

export function Setup() {
  const live = useLive();
  const [state, dispatch] = useReducer(wizard, initialWizard);
  const [settings, setSettings] = useState<SettingsResponse | null>(null);
  const [loadError, setLoadError] = useState<string | null>(null);
  const [savingRoles, setSavingRoles] = useState(false);
  const [rolesError, setRolesError] = useState<string | null>(null);
  const { step, join } = state;

  useEffect(() => {
    api
      .settings()
      .then((s) => {
        setSettings(s);
        // What the node runs now (its command line may differ from the file) is the better default.
        dispatch({
          type: 'loaded',
          choice: choiceFromRoles(live.status?.node.roles ?? s.settings.roles),
          proxyUrl: s.settings.worker.proxy_url && !s.settings.roles.proxy ? s.settings.worker.proxy_url : null,
        });
      })
      .catch((e) => setLoadError(errorMessage(e)));
  }, []);

  const roles = rolesFromChoice(state.choice);
  const go = (to: number) => dispatch({ type: 'go', step: to });

  const nextFromRoles = async () => {
    setRolesError(null);
    if (!roles.proxy) {
      // Worker only: turning the proxy off before the worker knows where to connect would leave
      // this node doing nothing; the roles are saved when it joins (step 3).
      dispatch({ type: 'rolesChosen', pending: true });
      return;
    }
    setSavingRoles(true);
    try {
      setSettings(await api.saveSettings({ roles }));
      dispatch({ type: 'rolesChosen', pending: false });
    } catch (e) {
      setRolesError(errorMessage(e));
    } finally {
      setSavingRoles(false);
    }
  };

  const finish = () => {
    markSetupDone();
    navigate('dashboard');
  };

  const clientUrl = roles.proxy
    ? (live.status?.node.url ?? location.origin)
    : (state.joinedUrl ?? (join.proxyUrl || null));

  return (
    <main class="page page-narrow" data-testid="setup">
      <div class="page-title">
        <h1>Set up this node</h1>
        <button type="button" class="btn btn-link" onClick={finish} data-testid="setup-skip">
          Skip to dashboard
        </button>
      </div>
      <ol class="stepper" aria-label="Setup steps">
        {STEPS.map((name, i) => (
          <li key={name} class={i === step ? 'current' : i < step ? 'done' : ''} aria-current={i === step ? 'step' : undefined}>
            <button type="button" class="stepper-btn" onClick={() => i < step && go(i)} disabled={i > step}>
              <span class="stepper-num">{i + 1}</span> {name}
            </button>
          </li>
        ))}
      </ol>
      {loadError ? <Alert kind="error">Could not read the settings: {loadError}</Alert> : null}

      {step === 0 ? (
        <RolesStep
          choice={state.choice}
          onChoose={(choice) => dispatch({ type: 'choose', choice })}
          error={rolesError}
          saving={savingRoles}
          ready={settings !== null}
          onNext={nextFromRoles}
        />
      ) : null}

      {step === 1 ? (
        <BackendsStep
          roles={roles}
          discovery={state.discovery}
          setDiscovery={(discovery) => dispatch({ type: 'discovered', discovery })}
          onPickProxy={(url, pin) => dispatch({ type: 'pickProxy', url, fingerprint: pin ?? null })}
          onBack={() => go(0)}
          onNext={() => go(2)}
        />
      ) : null}

      {step === 2 ? (
        <ConnectStep
          roles={roles}
          proxyUrl={join.proxyUrl}
          setProxyUrl={(proxyUrl) => dispatch({ type: 'edit', fields: { proxyUrl } })}
          secret={join.secret}
          setSecret={(secret) => dispatch({ type: 'edit', fields: { secret } })}
          provider={join.provider}
          setProvider={(provider) => dispatch({ type: 'edit', fields: { provider } })}
          fingerprint={join.fingerprint}
          setFingerprint={(fingerprint) => dispatch({ type: 'edit', fields: { fingerprint } })}
          discovery={state.discovery}
          onJoined={async (url) => {
            dispatch({ type: 'joined', url });
            if (state.rolesPending) {
              setSettings(await api.saveSettings({ roles }));
              dispatch({ type: 'rolesSaved' });
            }
          }}
          joinedUrl={state.joinedUrl}
          rolesPending={state.rolesPending}
          onBack={() => go(1)}
          onNext={() => go(3)}
        />
      ) : null}

      {step === 3 ? (
        <ClientsStep url={clientUrl} discovery={state.discovery} onBack={() => go(2)} onFinish={finish} />
      ) : null}
    </main>
  );
}
