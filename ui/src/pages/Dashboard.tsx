import { useMemo, useState } from 'preact/hooks';
import { api, errorMessage } from '../api';
import { Alert, Badge, Card, CopyButton, DataTable, Spinner } from '../components/common';
import { Chart } from '../components/Chart';
import { WorkerHardware } from '../components/Hardware';
import { requiresApiKeys } from '../lib/keys';
import { useLive } from '../live';
import {
  clockFor,
  seriesData,
  toDashboardView,
  toLifecycleRows,
  toSleeperRows,
  toStorageNotice,
  type DashboardView,
  type SleeperRow,
  type WorkerRow,
} from '../lib/viewmodel';
import type { AffinityStatus, ModelStatus, Status } from '../types';

export function Dashboard() {
  const { status, receivedAt } = useLive();
  const view = useMemo(
    () => (status ? toDashboardView(status, clockFor(status, receivedAt || Date.now())) : null),
    [status, receivedAt],
  );

  if (!status || !view) {
    return (
      <main class="page" data-testid="dashboard">
        <Spinner label="Connecting to the relay…" />
      </main>
    );
  }
  if (!status.node.roles.proxy) {
    // Worker only: the proxy this node serves has the workers, queues and traffic.
    const proxyUrl = status.node.worker.proxy_url;
    return (
      <main class="page" data-testid="dashboard">
        <NodeHeader view={view} />
        <Card title="Worker only" testid="worker-only">
          <p>
            This node runs no proxy: its worker serves{' '}
            {proxyUrl ? (
              <a href={proxyUrl} target="_blank" rel="noreferrer" data-testid="worker-only-proxy">
                {proxyUrl}
              </a>
            ) : (
              'no proxy yet'
            )}
            . Workers, queues and live traffic are on that proxy's dashboard.
          </p>
          {!proxyUrl ? (
            <p>
              <a href="#/setup">Join a proxy</a> to start serving.
            </p>
          ) : null}
        </Card>
        <LifecycleCard models={status.node.lifecycle ?? []} />
      </main>
    );
  }
  return (
    <main class="page" data-testid="dashboard">
      <NodeHeader view={view} requireKeys={requiresApiKeys(status)} affinity={status.affinity ?? null} />
      <StorageAlert status={status} nowMs={clockFor(status, receivedAt || Date.now())} />
      <Charts status={status} />
      <WorkersCard workers={view.workers} />
      <SleepersCard rows={toSleeperRows(status, clockFor(status, receivedAt || Date.now()))} />
      <div class="grid-2">
        <ModelsCard view={view} />
        <QueuesCard view={view} />
      </div>
      <InFlightCard view={view} />
      <LifecycleCard models={status.node.lifecycle ?? []} />
    </main>
  );
}

/** The proxy's database refuses writes: the relay serves on, and says what is not kept. */
function StorageAlert({ status, nowMs }: { status: Status; nowMs: number }) {
  const notice = toStorageNotice(status, nowMs);
  if (!notice) return null;
  return (
    <Alert kind="warning" testid="storage-problem">
      <strong>Serving, but not storing ({notice.since}):</strong> {notice.problem}. {notice.notStored} Keys are checked
      from memory; creating or revoking them waits until the database takes writes again.
    </Alert>
  );
}

/** `requireKeys`: whether inference needs a client key (null: not a proxy, or not said). */
function NodeHeader({
  view,
  requireKeys = null,
  affinity = null,
}: {
  view: DashboardView;
  requireKeys?: boolean | null;
  affinity?: AffinityStatus | null;
}) {
  const { node, totals } = view;
  const own = node.ownWorker;
  return (
    <section class="card node-header" data-testid="node-header" aria-label="This node">
      <div class="node-main">
        <div class="node-url">
          <span class="label">Relay URL</span>
          <a href={node.url} data-testid="node-url" target="_blank" rel="noreferrer">
            {node.url}
          </a>
          <CopyButton text={node.url} label="Copy URL" />
        </div>
        <dl class="facts">
          <div>
            <dt>Roles</dt>
            <dd data-testid="node-roles">
              {node.roles.length ? (
                node.roles.map((r) => (
                  <Badge key={r} tone="muted">
                    {r}
                  </Badge>
                ))
              ) : (
                <Badge tone="warn">none</Badge>
              )}
            </dd>
          </div>
          {requireKeys !== null ? (
            <div>
              <dt>API keys</dt>
              <dd data-testid="node-api-keys">
                <a href="#/keys" class="badge-link" title="Client API keys for inference">
                  <Badge tone={requireKeys ? 'ok' : 'muted'}>{requireKeys ? 'required' : 'not required'}</Badge>
                </a>
              </dd>
            </div>
          ) : null}
          <div>
            <dt>Own worker</dt>
            <dd data-testid="own-worker">
              <Badge tone={own.tone} testid="own-worker-state">
                {own.label}
              </Badge>
              {own.proxyUrl && own.state !== 'off' ? <span class="muted small"> → {own.proxyUrl}</span> : null}
            </dd>
          </div>
          <div>
            <dt>Listen</dt>
            <dd>{node.listen}</dd>
          </div>
          <div>
            <dt>Version</dt>
            <dd>{node.version}</dd>
          </div>
          <div>
            <dt>Uptime</dt>
            <dd>{node.uptime}</dd>
          </div>
        </dl>
        {own.state === 'drained' ? (
          <RejoinAlert reason={own.lastError} />
        ) : own.lastError ? (
          <Alert kind="warning" testid="own-worker-error">
            Worker: {own.lastError}
          </Alert>
        ) : null}
      </div>
      <dl class="totals" aria-label="Totals">
        <div>
          <dt>Requests</dt>
          <dd data-testid="total-requests">{totals.requests}</dd>
        </div>
        <div>
          <dt>Errors</dt>
          <dd data-testid="total-errors">
            {totals.errors}
            {totals.errorRate !== '—' ? <span class="muted small"> {totals.errorRate}</span> : null}
          </dd>
        </div>
        <div>
          <dt>Tokens</dt>
          <dd data-testid="total-tokens">{totals.tokens}</dd>
        </div>
        {affinity ? <AffinityTotal affinity={affinity} /> : null}
      </dl>
    </section>
  );
}

/** The share of returning conversations that found their worker (and its prompt cache) again. */
function AffinityTotal({ affinity }: { affinity: AffinityStatus }) {
  const returning = affinity.hits + affinity.misses;
  const rate = !affinity.enabled ? 'off' : returning ? `${Math.round((affinity.hits / returning) * 100)}%` : '—';
  return (
    <div>
      <dt title="Later turns of a conversation routed to the worker that served it last, whose backend still caches its prompt">
        Affinity hits
      </dt>
      <dd data-testid="affinity-hits" data-hits={affinity.hits} data-misses={affinity.misses} data-new={affinity.new}>
        {rate}
        {affinity.enabled ? (
          <span class="muted small">
            {' '}
            {affinity.hits} hit{affinity.hits === 1 ? '' : 's'} · {affinity.misses} miss{affinity.misses === 1 ? '' : 'es'}
          </span>
        ) : null}
      </dd>
    </div>
  );
}

function Charts({ status }: { status: Status }) {
  const req = useMemo(() => seriesData(status, 'requests_per_sec'), [status]);
  const tok = useMemo(() => seriesData(status, 'tokens_per_sec'), [status]);
  const queue = useMemo(() => seriesData(status, 'queue_depth'), [status]);
  const err = useMemo(() => seriesData(status, 'errors_per_sec'), [status]);
  return (
    <section class="charts" aria-label="Live charts" data-testid="charts">
      <Chart title="Requests/s" data={req} color="#2563eb" testid="chart-requests" />
      <Chart title="Tokens/s" data={tok} color="#16a34a" testid="chart-tokens" />
      <Chart title="Queue depth" data={queue} color="#d97706" testid="chart-queue" integer />
      <Chart title="Errors/s" data={err} color="#dc2626" testid="chart-errors" />
    </section>
  );
}

/** The own worker was drained by its proxy: it waits, and one click brings it back. */
function RejoinAlert({ reason }: { reason: string | null }) {
  const [pending, setPending] = useState(false);
  const [error, setError] = useState<string | null>(null);
  const rejoin = async () => {
    setPending(true);
    setError(null);
    try {
      await api.rejoinWorker();
    } catch (e) {
      setError(`Could not rejoin: ${errorMessage(e)}`);
    } finally {
      setPending(false);
    }
  };
  return (
    <Alert kind="warning" testid="own-worker-drained">
      <span>
        This node's worker was {reason ?? 'drained by the proxy'}. It finished its requests and waits
        here instead of reconnecting.
      </span>{' '}
      <button
        type="button"
        class="btn btn-small"
        disabled={pending}
        onClick={rejoin}
        data-testid="rejoin-button"
        title="Start this node's worker again and join its proxy"
      >
        {pending ? 'Rejoining…' : 'Rejoin'}
      </button>
      {error ? <div class="bad-text small">{error}</div> : null}
    </Alert>
  );
}

function WorkersCard({ workers }: { workers: WorkerRow[] }) {
  const [pending, setPending] = useState<Record<string, boolean>>({});
  const [message, setMessage] = useState<{ kind: 'error' | 'success'; text: string } | null>(null);
  const [refreshing, setRefreshing] = useState(false);

  const drain = async (w: WorkerRow) => {
    setPending((p) => ({ ...p, [w.id]: true }));
    setMessage(null);
    try {
      await api.drain(w.id);
      setMessage({ kind: 'success', text: `Draining ${w.name}: it finishes its requests, then disconnects.` });
    } catch (e) {
      setMessage({ kind: 'error', text: `Could not drain ${w.name}: ${errorMessage(e)}` });
    } finally {
      setPending((p) => ({ ...p, [w.id]: false }));
    }
  };

  const refresh = async () => {
    setRefreshing(true);
    setMessage(null);
    try {
      const r = await api.refreshModels();
      setMessage({
        kind: 'success',
        text: `Asked ${r.workers} worker${r.workers === 1 ? '' : 's'} to re-read their models.`,
      });
    } catch (e) {
      setMessage({ kind: 'error', text: `Could not refresh models: ${errorMessage(e)}` });
    } finally {
      setRefreshing(false);
    }
  };

  return (
    <Card
      title="Workers"
      testid="workers"
      actions={
        <button type="button" class="btn" onClick={refresh} disabled={refreshing} data-testid="refresh-models">
          {refreshing ? 'Refreshing…' : 'Refresh models'}
        </button>
      }
    >
      {message ? (
        <Alert kind={message.kind} testid="workers-message">
          {message.text}
        </Alert>
      ) : null}
      {workers.length === 0 ? (
        <p class="empty" data-testid="no-workers">
          No worker is connected. Start one on a GPU box, or use <a href="#/setup">Setup</a> to join this node.
        </p>
      ) : (
        <DataTable label="Workers" columns={['Name', 'Host', 'Models', 'Load', 'State', 'Connected', 'Heartbeat', '']}>
          {workers.flatMap((w) => [
            <tr key={w.id} data-testid="worker-row" data-worker-id={w.id} data-worker-name={w.name} data-state={w.state}>
              <td>
                <strong>{w.name}</strong>
                {w.provider !== 'local' ? <span class="muted small"> ({w.provider})</span> : null}
              </td>
              <td>{w.host}</td>
              <td class="models-cell" data-testid="worker-models">
                {w.models.length
                  ? w.models.map((m) => (
                      <code
                        key={m}
                        title={
                          [
                            w.windows[m] ? `context window: ${w.windows[m]} tokens per request` : '',
                            w.speeds[m] ? `measured: ${w.speeds[m]}` : '',
                          ]
                            .filter(Boolean)
                            .join('\n') || undefined
                        }
                      >
                        {m}
                        {w.windows[m] ? <span class="muted small" data-testid="model-window"> · {w.windows[m]}</span> : null}
                        {w.speeds[m] ? (
                          <span class="muted small" data-testid="model-speed">
                            {' '}
                            · {w.speeds[m]}
                          </span>
                        ) : null}
                      </code>
                    ))
                  : <span class="muted">none</span>}
              </td>
              <td data-testid="worker-load">
                <div class="load">
                  <span>{w.loadLabel}</span>
                  <span class="bar" aria-hidden="true">
                    <span style={{ width: `${Math.round(w.loadFraction * 100)}%` }} />
                  </span>
                </div>
              </td>
              <td>
                <Badge tone={w.tone} testid="worker-state">
                  {w.state}
                </Badge>
              </td>
              <td title={w.connectedAt}>{w.connectedSince}</td>
              <td data-testid="worker-heartbeat">{w.heartbeat}</td>
              <td class="actions-cell">
                <button
                  type="button"
                  class="btn btn-small btn-warn"
                  disabled={!w.canDrain || pending[w.id]}
                  onClick={() => drain(w)}
                  aria-label={`Drain ${w.name}`}
                  title="Stop routing new requests to this worker; it finishes what it runs, then disconnects"
                  data-testid="drain-button"
                >
                  {w.canDrain ? (pending[w.id] ? 'Draining…' : 'Drain') : 'Draining'}
                </button>
              </td>
            </tr>,
            w.hardware ? (
              <tr key={`${w.id}-hardware`} class="hardware-row" data-testid="worker-hardware-row" data-worker-name={w.name}>
                <td colSpan={8}>
                  <WorkerHardware view={w.hardware} />
                </td>
              </tr>
            ) : null,
          ])}
        </DataTable>
      )}
    </Card>
  );
}

/** Boxes that went to sleep: their models stay listed; a request for one wakes its box. */
function SleepersCard({ rows }: { rows: SleeperRow[] }) {
  if (rows.length === 0) return null;
  return (
    <Card title="Sleeping boxes" testid="sleepers">
      <DataTable label="Sleeping boxes" columns={['Name', 'Models', 'State', 'Asleep for', 'Waking for', 'MAC address']}>
        {rows.map((s) => (
          <tr key={`${s.provider}/${s.name}`} data-testid="sleeper-row" data-sleeper-name={s.name} data-state={s.state}>
            <td>
              <strong>{s.name}</strong>
              {s.provider !== 'local' ? <span class="muted small"> ({s.provider})</span> : null}
            </td>
            <td class="models-cell" data-testid="sleeper-models">
              {s.models.map((m) => (
                <code key={m}>{m}</code>
              ))}
            </td>
            <td>
              <Badge tone={s.tone} testid="sleeper-state">
                {s.stateLabel}
              </Badge>
              {s.wakeCause ? (
                <div class="muted small" data-testid="sleeper-cause">
                  {s.wakeCause}
                </div>
              ) : null}
            </td>
            <td data-testid="sleeper-since">{s.asleepFor}</td>
            <td data-testid="sleeper-waking">{s.wakingFor}</td>
            <td>
              <code>{s.mac}</code>
            </td>
          </tr>
        ))}
      </DataTable>
      <p class="muted small">
        A request for one of these models waits in the queue while the proxy sends the box a Wake-on-LAN packet; it
        is answered when the box's worker reconnects.
      </p>
    </Card>
  );
}

function ModelsCard({ view }: { view: DashboardView }) {
  return (
    <Card title="Models" testid="models">
      {view.models.length === 0 ? (
        <p class="empty">No model is served yet.</p>
      ) : (
        <DataTable label="Models" columns={['Model', 'Provider', 'Served by']}>
          {view.models.map((m) => (
            <tr key={`${m.provider}/${m.name}`} data-testid="model-row" data-model={m.name}>
              <td>
                <code>{m.name}</code>
              </td>
              <td>{m.provider}</td>
              <td class={m.workerNames.length ? '' : 'muted'}>{m.workersLabel}</td>
            </tr>
          ))}
        </DataTable>
      )}
    </Card>
  );
}

function QueuesCard({ view }: { view: DashboardView }) {
  return (
    <Card title="Queues" testid="queues">
      {view.queues.length === 0 ? (
        <p class="empty">No provider queue.</p>
      ) : (
        <ul class="queue-list">
          {view.queues.map((q) => (
            <li key={q.provider} data-testid="queue-row" data-provider={q.provider}>
              <span>{q.provider}</span>
              <strong data-testid="queue-depth" class={q.depth > 0 ? 'warn-text' : ''}>
                {q.depth} queued
              </strong>
            </li>
          ))}
        </ul>
      )}
    </Card>
  );
}

function InFlightCard({ view }: { view: DashboardView }) {
  return (
    <Card title={`In flight (${view.inFlightTotal})`} testid="in-flight">
      {view.inFlight.length === 0 ? (
        <p class="empty" data-testid="no-in-flight">
          No request in flight.
        </p>
      ) : (
        <DataTable
          label="In-flight requests"
          columns={['Model', 'Worker', 'Why there', 'State', 'Age', 'TTFT', 'Tokens', 'Tokens/s']}
          footer={
            view.inFlightTotal > view.inFlight.length ? (
              <p class="muted small">
                Showing the {view.inFlight.length} oldest of {view.inFlightTotal} requests.
              </p>
            ) : null
          }
        >
          {view.inFlight.map((r) => (
            <tr key={r.id} data-testid="in-flight-row" data-request-id={r.id} data-state={r.state}>
              <td>
                <code>{r.model}</code>
                {r.streaming ? <span class="muted small"> stream</span> : null}
              </td>
              <td data-testid="in-flight-worker">{r.worker}</td>
              <td class="muted small" data-testid="in-flight-reason">
                {r.reason}
                {r.weighed ? (
                  <div class="weighed" data-testid="in-flight-weighed">
                    {r.weighed}
                  </div>
                ) : null}
              </td>
              <td>
                <Badge tone={r.state === 'running' ? 'busy' : 'warn'}>{r.state}</Badge>
              </td>
              <td>{r.age}</td>
              <td>{r.ttft}</td>
              <td data-testid="in-flight-tokens">{r.tokens}</td>
              <td>{r.tokensPerSec}</td>
            </tr>
          ))}
        </DataTable>
      )}
      {view.placements ? (
        <p class="muted small placements" data-testid="placement-counts">
          Placed since start: {view.placements}
        </p>
      ) : null}
    </Card>
  );
}

/**
 * The model map of this node's worker (llama-server processes it starts on demand), as the
 * status feed pushes it on every change.
 */
function LifecycleCard({ models }: { models: ModelStatus[] }) {
  const [error, setError] = useState<string | null>(null);
  const [busy, setBusy] = useState<string | null>(null);

  const act = async (name: string, action: 'load' | 'unload') => {
    setBusy(`${name}:${action}`);
    setError(null);
    try {
      await api.lifecycleAction(name, action);
    } catch (e) {
      setError(`${action === 'load' ? 'Load' : 'Unload'} ${name}: ${errorMessage(e)}`);
    } finally {
      setBusy(null);
    }
  };

  // Hidden when this node's worker has no model map.
  if (models.length === 0) return null;
  const rows = toLifecycleRows(models, Date.now());
  return (
    <Card title="Model lifecycle" testid="lifecycle">
      {error ? <Alert kind="error">{error}</Alert> : null}
      <DataTable label="Model lifecycle" columns={['Model', 'State', 'Process', 'Last used', 'In flight', 'Restarts / crashes', '']}>
        {rows.map((m) => (
          <tr key={m.name} data-testid="lifecycle-row" data-model={m.name} data-state={m.state}>
            <td>
              <code>{m.name}</code>
              {m.lastError ? <div class="bad-text small">{m.lastError}</div> : null}
            </td>
            <td>
              <Badge tone={m.tone}>{m.state}</Badge>
            </td>
            <td class="small">{m.detail}</td>
            <td>{m.lastUsed}</td>
            <td>{m.inFlight}</td>
            <td>
              {m.restarts} / {m.crashes}
            </td>
            <td class="actions-cell">
              <button
                type="button"
                class="btn btn-small"
                disabled={!m.canLoad || busy !== null}
                onClick={() => act(m.name, 'load')}
                aria-label={`Load ${m.name}`}
              >
                {busy === `${m.name}:load` ? 'Loading…' : 'Load'}
              </button>{' '}
              <button
                type="button"
                class="btn btn-small"
                disabled={!m.canUnload || busy !== null}
                onClick={() => act(m.name, 'unload')}
                aria-label={`Unload ${m.name}`}
              >
                {busy === `${m.name}:unload` ? 'Unloading…' : 'Unload'}
              </button>
            </td>
          </tr>
        ))}
      </DataTable>
    </Card>
  );
}
