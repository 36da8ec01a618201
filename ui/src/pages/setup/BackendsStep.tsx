// Step 2: the model servers on this machine and the proxies on the network.
import { useEffect, useState } from 'preact/hooks';
import { api, errorMessage } from '../../api';
import { Alert, Card, DataTable, Spinner } from '../../components/common';
import { ConfirmDialog } from '../../components/ConfirmDialog';
import type { DiscoveredBackend, Discovery, Roles } from '../../types';

/** Who runs a found server, in words. */
function ownerText(b: DiscoveredBackend): string {
  switch (b.owner.user) {
    case 'this_user':
      return 'yours';
    case 'other_user':
      return `another user's (uid ${b.owner.uid})`;
    default:
      return 'owner unknown';
  }
}

export function BackendsStep({
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
  // A server another user runs, waiting for the owner's confirmation.
  const [confirming, setConfirming] = useState<DiscoveredBackend | null>(null);
  const [confirmBusy, setConfirmBusy] = useState(false);
  const [confirmError, setConfirmError] = useState<string | null>(null);

  const confirm = async (b: DiscoveredBackend) => {
    setConfirmBusy(true);
    setConfirmError(null);
    try {
      const settings = await api.settings();
      const urls = new Set(settings.settings.worker.confirmed_backends ?? []);
      urls.add(b.url);
      await api.confirmBackends([...urls]);
      setConfirming(null);
      await run();
    } catch (e) {
      setConfirmError(errorMessage(e));
    } finally {
      setConfirmBusy(false);
    }
  };

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
          The worker serves the model servers you run here (llama-server, Ollama, vLLM, LM Studio, llamafile). Start
          yours, then press Refresh. A server another user runs is listed but not used unless you confirm it.
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
            <DataTable label="Discovered model servers" columns={['Server', 'URL', 'Models', 'Runs as']}>
              {discovery.backends.map((b) => (
                <tr key={b.url} data-testid="backend-row" data-url={b.url} data-usable={String(b.usable)}>
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
                  <td data-testid="backend-owner">
                    {b.usable ? (
                      <span>
                        {ownerText(b)}
                        {b.confirmed && b.owner.user !== 'this_user' ? <span class="muted small"> · confirmed by you</span> : null}
                      </span>
                    ) : (
                      <span>
                        <span class="badge badge-warn" title="Its listening socket is not yours: the worker sends it nothing">
                          not used
                        </span>{' '}
                        <span class="muted small">{ownerText(b)}</span>{' '}
                        {roles.worker ? (
                          <button
                            type="button"
                            class="btn btn-small"
                            onClick={() => {
                              setConfirmError(null);
                              setConfirming(b);
                            }}
                            data-testid="backend-confirm"
                          >
                            Use it…
                          </button>
                        ) : null}
                      </span>
                    )}
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
      {confirming ? (
        <ConfirmDialog
          title="Use a server another user runs?"
          confirmLabel="Use it"
          busy={confirmBusy}
          error={confirmError}
          onConfirm={() => void confirm(confirming)}
          onCancel={() => setConfirming(null)}
          testid="backend-confirm-dialog"
        >
          <p>
            <code>{confirming.url}</code> is {ownerText(confirming)}, not yours. Whoever runs it would read every prompt
            this worker sends it. Use it only if you know who runs it.
          </p>
        </ConfirmDialog>
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

