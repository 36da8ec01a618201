import { useEffect, useMemo, useState } from 'preact/hooks';
import { api, errorMessage, type JoinRequest } from '../api';
import { Alert, Badge, Card, CodeBlock, CopyButton, DataTable, Spinner } from '../components/common';
import { navigate } from '../hash';
import { decodeJoinCode, isFingerprint, looksLikeJoinCode } from '../lib/joincode';
import { buildSnippets, normalizeBaseUrl, workerCommand } from '../lib/snippets';
import { useLive } from '../live';
import type { Discovery, JoinCodeInfo, JoinTestResult, Roles, SettingsResponse } from '../types';

export const SETUP_DONE_KEY = 'modelrelay.setupDone';

export type RoleChoice = 'both' | 'proxy' | 'worker';

export function choiceFromRoles(r: Roles): RoleChoice {
  if (r.proxy && !r.worker) return 'proxy';
  if (!r.proxy && r.worker) return 'worker';
  return 'both';
}

export function rolesFromChoice(c: RoleChoice): Roles {
  return { proxy: c !== 'worker', worker: c !== 'proxy' };
}

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

const STEPS = ['Roles', 'Model servers', 'Connect', 'Clients'] as const;

export function markSetupDone() {
  try {
    localStorage.setItem(SETUP_DONE_KEY, '1');
  } catch {
    /* ignore */
  }
}

export function Setup() {
  const live = useLive();
  const [step, setStep] = useState(0);
  const [settings, setSettings] = useState<SettingsResponse | null>(null);
  const [loadError, setLoadError] = useState<string | null>(null);
  const [choice, setChoice] = useState<RoleChoice>('both');
  const [savingRoles, setSavingRoles] = useState(false);
  const [rolesError, setRolesError] = useState<string | null>(null);
  const [rolesPending, setRolesPending] = useState(false);
  // Join form state lives here so a proxy picked in step 2 fills step 3.
  const [proxyUrl, setProxyUrl] = useState('');
  const [secret, setSecret] = useState('');
  const [provider, setProvider] = useState('');
  // The proxy's certificate fingerprint, from a join code or a proxy found on the network.
  const [fingerprint, setFingerprint] = useState('');
  const [joinedUrl, setJoinedUrl] = useState<string | null>(null);
  const [discovery, setDiscovery] = useState<Discovery | null>(null);

  useEffect(() => {
    api
      .settings()
      .then((s) => {
        setSettings(s);
        // What the node runs now (its command line may differ from the file) is the better default.
        setChoice(choiceFromRoles(live.status?.node.roles ?? s.settings.roles));
        if (s.settings.worker.proxy_url && !s.settings.roles.proxy) setProxyUrl(s.settings.worker.proxy_url);
      })
      .catch((e) => setLoadError(errorMessage(e)));
  }, []);

  const roles = rolesFromChoice(choice);

  const nextFromRoles = async () => {
    setRolesError(null);
    if (!roles.proxy) {
      // Worker only: turning the proxy off before the worker knows where to connect would leave
      // this node doing nothing; the roles are saved when it joins (step 3).
      setRolesPending(true);
      setStep(1);
      return;
    }
    setSavingRoles(true);
    try {
      const s = await api.saveSettings({ roles });
      setSettings(s);
      setRolesPending(false);
      setStep(1);
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

  const clientUrl = roles.proxy ? (live.status?.node.url ?? location.origin) : (joinedUrl ?? (proxyUrl || null));

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
            <button type="button" class="stepper-btn" onClick={() => i < step && setStep(i)} disabled={i > step}>
              <span class="stepper-num">{i + 1}</span> {name}
            </button>
          </li>
        ))}
      </ol>
      {loadError ? <Alert kind="error">Could not read the settings: {loadError}</Alert> : null}

      {step === 0 ? (
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
                  onChange={() => setChoice(o.value)}
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
          {rolesError ? <Alert kind="error">Could not save the roles: {rolesError}</Alert> : null}
          <div class="row-end">
            <button type="button" class="btn btn-primary" onClick={nextFromRoles} disabled={savingRoles || !settings}>
              {savingRoles ? 'Saving…' : 'Next'}
            </button>
          </div>
        </Card>
      ) : null}

      {step === 1 ? (
        <BackendsStep
          roles={roles}
          discovery={discovery}
          setDiscovery={setDiscovery}
          onPickProxy={(url, pin) => {
            setProxyUrl(url);
            setFingerprint(pin ?? '');
            setStep(2);
          }}
          onBack={() => setStep(0)}
          onNext={() => setStep(2)}
        />
      ) : null}

      {step === 2 ? (
        <ConnectStep
          roles={roles}
          proxyUrl={proxyUrl}
          setProxyUrl={setProxyUrl}
          secret={secret}
          setSecret={setSecret}
          provider={provider}
          fingerprint={fingerprint}
          setFingerprint={setFingerprint}
          setProvider={setProvider}
          discovery={discovery}
          onJoined={async (url) => {
            setJoinedUrl(url);
            if (rolesPending) {
              const s = await api.saveSettings({ roles });
              setSettings(s);
              setRolesPending(false);
            }
          }}
          joinedUrl={joinedUrl}
          rolesPending={rolesPending}
          onBack={() => setStep(1)}
          onNext={() => setStep(3)}
        />
      ) : null}

      {step === 3 ? (
        <ClientsStep
          url={clientUrl}
          discovery={discovery}
          onBack={() => setStep(2)}
          onFinish={finish}
        />
      ) : null}
    </main>
  );
}

function BackendsStep({
  roles,
  discovery,
  setDiscovery,
  onPickProxy,
  onBack,
  onNext,
}: {
  roles: Roles;
  discovery: Discovery | null;
  setDiscovery: (d: Discovery) => void;
  onPickProxy: (url: string, fingerprint?: string | null) => void;
  onBack: () => void;
  onNext: () => void;
}) {
  const [loading, setLoading] = useState(false);
  const [error, setError] = useState<string | null>(null);

  const run = async () => {
    setLoading(true);
    setError(null);
    try {
      setDiscovery(await api.discovery());
    } catch (e) {
      setError(errorMessage(e));
    } finally {
      setLoading(false);
    }
  };

  useEffect(() => {
    if (!discovery) void run();
    // eslint-disable-next-line react-hooks/exhaustive-deps
  }, []);

  return (
    <Card
      title="Model servers on this machine"
      testid="setup-step-backends"
      actions={
        <button type="button" class="btn" onClick={run} disabled={loading} data-testid="discovery-refresh">
          {loading ? 'Looking…' : 'Refresh'}
        </button>
      }
    >
      {!roles.worker ? (
        <p class="muted">This node runs no worker, so it serves none of these; they are listed for information.</p>
      ) : (
        <p class="muted">
          The worker serves every model server found here (llama-server, Ollama, vLLM, LM Studio, llamafile). Start
          yours, then press Refresh.
        </p>
      )}
      {loading && !discovery ? <Spinner label="Looking for model servers and proxies…" /> : null}
      {error ? <Alert kind="error">Discovery failed: {error}</Alert> : null}
      {discovery ? (
        <>
          {discovery.backends.length === 0 ? (
            <p class="empty" data-testid="no-backends">
              No model server found on the usual ports.
            </p>
          ) : (
            <DataTable label="Discovered model servers" columns={['Server', 'URL', 'Models']}>
              {discovery.backends.map((b) => (
                <tr key={b.url} data-testid="backend-row" data-url={b.url}>
                  <td>
                    <strong>{b.label || b.kind}</strong>
                    {b.label && b.kind && b.label !== b.kind ? <span class="muted small"> {b.kind}</span> : null}
                  </td>
                  <td>
                    <code>{b.url}</code>
                  </td>
                  <td class="models-cell">
                    {b.models.length ? b.models.map((m) => <code key={m}>{m}</code>) : <span class="muted">none</span>}
                  </td>
                </tr>
              ))}
            </DataTable>
          )}
          <h3>Proxies on this network</h3>
          {discovery.proxies.length === 0 ? (
            <p class="empty" data-testid="no-proxies">
              No ModelRelay proxy announced itself on the local network.
            </p>
          ) : (
            <ul class="proxy-list">
              {discovery.proxies.map((p) => (
                <li key={p.url} data-testid="proxy-row">
                  <span>
                    <strong>{p.name}</strong> <code>{p.url}</code>
                    {p.fingerprint ? (
                      <span class="small muted" data-testid="proxy-fingerprint">
                        {' '}
                        TLS certificate <code>{p.fingerprint}</code>
                      </span>
                    ) : null}
                  </span>
                  {roles.worker ? (
                    <button type="button" class="btn btn-small" onClick={() => onPickProxy(p.url, p.fingerprint)} aria-label={`Use proxy ${p.name}`}>
                      Use this proxy
                    </button>
                  ) : null}
                </li>
              ))}
            </ul>
          )}
        </>
      ) : null}
      <div class="row-between">
        <button type="button" class="btn" onClick={onBack}>
          Back
        </button>
        <button type="button" class="btn btn-primary" onClick={onNext}>
          Next
        </button>
      </div>
    </Card>
  );
}

function ConnectStep(props: {
  roles: Roles;
  proxyUrl: string;
  setProxyUrl: (v: string) => void;
  secret: string;
  setSecret: (v: string) => void;
  provider: string;
  setProvider: (v: string) => void;
  fingerprint: string;
  setFingerprint: (v: string) => void;
  discovery: Discovery | null;
  onJoined: (url: string) => Promise<void>;
  joinedUrl: string | null;
  rolesPending: boolean;
  onBack: () => void;
  onNext: () => void;
}) {
  const { roles } = props;
  return (
    <>
      {roles.proxy ? <JoinCodePanel /> : null}
      {roles.worker ? <JoinForm {...props} /> : null}
      <div class="row-between">
        <button type="button" class="btn" onClick={props.onBack}>
          Back
        </button>
        <button type="button" class="btn btn-primary" onClick={props.onNext} data-testid="connect-next">
          {!roles.proxy && !props.joinedUrl ? 'Skip' : 'Next'}
        </button>
      </div>
    </>
  );
}

function validateJoin(proxyUrl: string, secret: string, fingerprint: string): string | null {
  if (!/^https?:\/\/[^\s/]+/i.test(proxyUrl.trim())) return 'Enter the proxy URL, e.g. http://192.168.1.10:8080.';
  if (!secret.trim()) return "Enter the proxy's worker secret.";
  if (fingerprint.trim() && !isFingerprint(fingerprint)) {
    return 'The certificate fingerprint is sha256: followed by 64 hex digits, as the proxy shows it; or leave it empty.';
  }
  return null;
}

function JoinForm({
  roles,
  proxyUrl,
  setProxyUrl,
  secret,
  setSecret,
  provider,
  setProvider,
  fingerprint,
  setFingerprint,
  discovery,
  onJoined,
  joinedUrl,
  rolesPending,
}: Parameters<typeof ConnectStep>[0]) {
  const live = useLive();
  const [code, setCode] = useState('');
  const [codeError, setCodeError] = useState<string | null>(null);
  const [formError, setFormError] = useState<string | null>(null);
  const [testing, setTesting] = useState(false);
  const [testResult, setTestResult] = useState<JoinTestResult | null>(null);
  const [joining, setJoining] = useState(false);
  const [joinError, setJoinError] = useState<string | null>(null);

  const onCode = (value: string) => {
    setCode(value);
    setTestResult(null);
    if (!value.trim()) {
      setCodeError(null);
      return;
    }
    const r = decodeJoinCode(value);
    if (r.ok) {
      setCodeError(null);
      setProxyUrl(r.details.url);
      setSecret(r.details.secret);
      setProvider(r.details.provider ?? '');
      setFingerprint(r.details.fingerprint ?? '');
    } else {
      setCodeError(r.error);
    }
  };

  const body = (): JoinRequest => {
    const b: JoinRequest = { proxy_url: normalizeBaseUrl(proxyUrl), secret: secret.trim() };
    if (provider.trim()) b.provider = provider.trim();
    if (fingerprint.trim()) b.fingerprint = fingerprint.trim();
    return b;
  };

  const test = async () => {
    const invalid = validateJoin(proxyUrl, secret, fingerprint);
    setFormError(invalid);
    setTestResult(null);
    if (invalid) return;
    setTesting(true);
    try {
      setTestResult(await api.joinTest(body()));
    } catch (e) {
      setTestResult({ ok: false, message: errorMessage(e) });
    } finally {
      setTesting(false);
    }
  };

  const join = async () => {
    const invalid = validateJoin(proxyUrl, secret, fingerprint);
    setFormError(invalid);
    setJoinError(null);
    if (invalid) return;
    setJoining(true);
    try {
      await api.join(body());
      await onJoined(normalizeBaseUrl(proxyUrl));
    } catch (e) {
      setJoinError(errorMessage(e));
    } finally {
      setJoining(false);
    }
  };

  const own = live.status?.node.worker;
  const proxies = discovery?.proxies ?? [];

  return (
    <Card title={roles.proxy ? 'Join another proxy (optional)' : 'Join a proxy'} testid="setup-join">
      <p class="muted">
        {roles.proxy
          ? "This node's worker serves its own proxy. To serve a proxy on another box instead, join it here."
          : 'Paste the join code the proxy shows in its setup, or enter its URL and worker secret.'}
      </p>
      <label class="field">
        <span>Join code</span>
        <input
          type="text"
          value={code}
          placeholder="mrj1.…"
          spellcheck={false}
          autocomplete="off"
          onInput={(e) => onCode((e.target as HTMLInputElement).value)}
          aria-invalid={codeError ? 'true' : undefined}
          aria-describedby="join-code-help"
        />
        <span id="join-code-help" class={codeError ? 'field-error' : 'muted small'}>
          {codeError ??
            (code && looksLikeJoinCode(code) ? 'Join code read: the fields below are filled in.' : 'Optional: fills in the fields below.')}
        </span>
      </label>
      <div class="form-grid">
        <label class="field">
          <span>Proxy URL</span>
          <input
            type="url"
            value={proxyUrl}
            placeholder="http://192.168.1.10:8080"
            list="discovered-proxies"
            onInput={(e) => {
              setProxyUrl((e.target as HTMLInputElement).value);
              setTestResult(null);
            }}
          />
          <datalist id="discovered-proxies">
            {proxies.map((p) => (
              <option key={p.url} value={p.url}>
                {p.name}
              </option>
            ))}
          </datalist>
        </label>
        <label class="field">
          <span>Worker secret</span>
          <input
            type="password"
            value={secret}
            autocomplete="off"
            onInput={(e) => {
              setSecret((e.target as HTMLInputElement).value);
              setTestResult(null);
            }}
          />
        </label>
        <label class="field">
          <span>Provider (optional)</span>
          <input
            type="text"
            value={provider}
            placeholder="local"
            onInput={(e) => setProvider((e.target as HTMLInputElement).value)}
          />
        </label>
        <label class="field">
          <span>Certificate fingerprint (for a proxy serving TLS)</span>
          <input
            type="text"
            value={fingerprint}
            placeholder="sha256:…"
            spellcheck={false}
            autocomplete="off"
            data-testid="join-fingerprint"
            onInput={(e) => {
              setFingerprint((e.target as HTMLInputElement).value);
              setTestResult(null);
            }}
          />
          <span class="muted small">The worker then connects encrypted and trusts only this certificate.</span>
        </label>
      </div>
      {proxies.length ? (
        <p class="small">
          Found on this network:{' '}
          {proxies.map((p) => (
            <button
              key={p.url}
              type="button"
              class="btn btn-link"
              onClick={() => {
                setProxyUrl(p.url);
                setFingerprint(p.fingerprint ?? '');
              }}
            >
              {p.name} ({p.url})
            </button>
          ))}
        </p>
      ) : null}
      {formError ? <Alert kind="error">{formError}</Alert> : null}
      <div class="row-start">
        <button type="button" class="btn" onClick={test} disabled={testing || joining} data-testid="join-test">
          {testing ? 'Testing…' : 'Test connection'}
        </button>
        <button type="button" class="btn btn-primary" onClick={join} disabled={joining || testing} data-testid="join-button">
          {joining ? 'Joining…' : 'Join'}
        </button>
      </div>
      {testing ? <Spinner label="Connecting to the proxy…" /> : null}
      {testResult ? (
        <div
          class={`alert ${testResult.ok ? 'alert-success' : 'alert-error'}`}
          role={testResult.ok ? 'status' : 'alert'}
          data-testid="join-test-result"
          data-ok={String(testResult.ok)}
        >
          <strong>{testResult.ok ? 'Connection works.' : 'Connection failed.'}</strong> {testResult.message}
        </div>
      ) : null}
      {joinError ? (
        <Alert kind="error" testid="join-error">
          Could not join: {joinError}
        </Alert>
      ) : null}
      {joinedUrl ? (
        <div class="alert alert-success" role="status" data-testid="join-result">
          Joined <code>{joinedUrl}</code>. This node's worker is{' '}
          <Badge tone={own?.state === 'connected' ? 'ok' : own?.state === 'disconnected' ? 'bad' : 'warn'} testid="join-worker-state">
            {own?.state ?? 'starting'}
          </Badge>
          {own?.last_error ? <span class="small"> {own.last_error}</span> : null}
        </div>
      ) : rolesPending ? (
        <p class="muted small">The worker-only role is saved when this node joins a proxy.</p>
      ) : null}
    </Card>
  );
}

function JoinCodePanel() {
  const [info, setInfo] = useState<JoinCodeInfo | null>(null);
  const [error, setError] = useState<string | null>(null);
  const [showSecret, setShowSecret] = useState(false);

  useEffect(() => {
    api
      .joinCode()
      .then(setInfo)
      .catch((e) => setError(errorMessage(e)));
  }, []);

  const loopback = info ? /^https?:\/\/(127\.|localhost|\[::1\])/i.test(info.url) : false;
  return (
    <Card title="Let other boxes join this proxy" testid="setup-join-code">
      {error ? <Alert kind="error">Could not read this node's join code: {error}</Alert> : null}
      {!info && !error ? <Spinner label="Reading the join code…" /> : null}
      {info ? (
        <>
          <p class="muted">
            On each GPU box, open ModelRelay's setup, choose <em>Worker only</em> and paste this code, or run the command
            below.
          </p>
          <label class="field">
            <span>Join code</span>
            <div class="input-row">
              <input type="text" readOnly value={info.code} data-testid="own-join-code" onFocus={(e) => (e.target as HTMLInputElement).select()} />
              <CopyButton text={info.code} label="Copy join code" testid="copy-join-code" />
            </div>
          </label>
          <dl class="facts">
            <div>
              <dt>Proxy URL</dt>
              <dd>
                <code>{info.url}</code>
              </dd>
            </div>
            {info.fingerprint ? (
              <div>
                <dt>TLS certificate</dt>
                <dd>
                  <code data-testid="own-fingerprint">{info.fingerprint}</code>
                </dd>
              </div>
            ) : null}
            <div>
              <dt>Worker secret</dt>
              <dd>
                <code>{showSecret ? info.secret : '••••••••'}</code>{' '}
                <button type="button" class="btn btn-link" onClick={() => setShowSecret(!showSecret)}>
                  {showSecret ? 'Hide' : 'Show'}
                </button>
              </dd>
            </div>
          </dl>
          <CodeBlock text={workerCommand(info.url, info.secret, info.provider, info.fingerprint)} label="worker command" />
          {loopback ? (
            <Alert kind="warning">
              This node listens on a loopback address, so other machines cannot reach it. Set <em>Listen address</em> to
              e.g. <code>0.0.0.0:8080</code> in <a href="#/settings">Settings</a> and restart.
            </Alert>
          ) : null}
        </>
      ) : null}
    </Card>
  );
}

function ClientsStep({
  url,
  discovery,
  onBack,
  onFinish,
}: {
  url: string | null;
  discovery: Discovery | null;
  onBack: () => void;
  onFinish: () => void;
}) {
  const live = useLive();
  const models = useMemo(() => {
    const served = (live.status?.models ?? []).map((m) => m.name);
    const found = (discovery?.backends ?? []).flatMap((b) => b.models);
    return Array.from(new Set([...served, ...found]));
  }, [live.status, discovery]);
  const [model, setModel] = useState<string>('');
  const chosen = model || models[0] || '';
  const base = url ?? 'http://PROXY-HOST:8080';
  const snippets = buildSnippets(base, chosen || null);

  return (
    <Card title="Point your clients at the relay" testid="setup-step-clients">
      <p>
        Relay URL: <code data-testid="client-url">{normalizeBaseUrl(base)}</code> <CopyButton text={normalizeBaseUrl(base)} label="Copy relay URL" />
      </p>
      {models.length ? (
        <label class="field field-inline">
          <span>Model</span>
          <select value={chosen} onChange={(e) => setModel((e.target as HTMLSelectElement).value)}>
            {models.map((m) => (
              <option key={m} value={m}>
                {m}
              </option>
            ))}
          </select>
        </label>
      ) : (
        <p class="muted small">No model is served yet: replace MODEL with one once a worker is connected.</p>
      )}
      <div class="snippets">
        {snippets.map((s) => (
          <div key={s.id} class="snippet" data-testid={`snippet-${s.id}`}>
            <h3>{s.title}</h3>
            <p class="muted small">{s.description}</p>
            <CodeBlock text={s.text} label={`${s.title} snippet`} />
          </div>
        ))}
      </div>
      <div class="row-between">
        <button type="button" class="btn" onClick={onBack}>
          Back
        </button>
        <button type="button" class="btn btn-primary" onClick={onFinish} data-testid="setup-finish">
          Go to the dashboard
        </button>
      </div>
    </Card>
  );
}
