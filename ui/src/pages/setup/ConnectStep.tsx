// Step 3: this proxy's join code, and joining another proxy as a worker.
import { useEffect, useState } from 'preact/hooks';
import { api, errorMessage } from '../../api';
import type { JoinRequest } from '../../types';
import { Alert, Badge, Card, CodeBlock, CopyButton, Spinner } from '../../components/common';
import { decodeJoinCode, isFingerprint, looksLikeJoinCode } from '../../lib/joincode';
import { normalizeBaseUrl, workerCommand } from '../../lib/snippets';
import { useLive } from '../../live';
import type { Discovery, JoinCodeInfo, JoinTestResult, Roles } from '../../types';

export function ConnectStep(props: {
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
                <code data-testid="own-proxy-url">{info.url}</code>
              </dd>
            </div>
            {info.urls && info.urls.length > 1 ? (
              <div>
                <dt>Also reachable at</dt>
                <dd data-testid="own-proxy-urls">
                  {info.urls.slice(1).map((url, i) => (
                    <span key={url}>
                      {i > 0 ? ', ' : null}
                      <code>{url}</code>
                    </span>
                  ))}
                  <div class="muted small">The join code carries them all; a joining box uses the first it reaches.</div>
                </dd>
              </div>
            ) : null}
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

