// The list of keys: what each is for, when it was made and last used, its limits, and a revoke
// button (asked to confirm: a revoked key cannot be brought back).
import { useState } from 'preact/hooks';
import { api, errorMessage } from '../../api';
import { Alert, Badge, Card, DataTable, Spinner } from '../../components/common';
import { ConfirmDialog } from '../../components/ConfirmDialog';
import { formatAgo, formatInstant, isRevoked, limitsLabel, sortKeys } from '../../lib/keys';
import type { ApiKey } from '../../types';

export function KeysCard({
  keys,
  loadError,
  onRevoked,
  onReload,
}: {
  keys: ApiKey[] | null;
  loadError: string | null;
  onRevoked: (id: string, at: string) => void;
  onReload: () => void;
}) {
  const [confirming, setConfirming] = useState<ApiKey | null>(null);
  const [revoking, setRevoking] = useState(false);
  const [revokeError, setRevokeError] = useState<string | null>(null);
  const [message, setMessage] = useState<string | null>(null);

  const revoke = async () => {
    if (!confirming) return;
    setRevoking(true);
    setRevokeError(null);
    try {
      await api.revokeKey(confirming.id);
      onRevoked(confirming.id, new Date().toISOString());
      setMessage(`Revoked “${confirming.name}”: requests with it are now refused.`);
      setConfirming(null);
    } catch (e) {
      setRevokeError(errorMessage(e));
    } finally {
      setRevoking(false);
    }
  };

  const now = Date.now();
  return (
    <Card
      title="Keys"
      testid="keys-list"
      actions={
        <button type="button" class="btn" onClick={onReload} data-testid="keys-reload">
          Reload
        </button>
      }
    >
      {message ? (
        <Alert kind="success" testid="keys-message">
          {message}
        </Alert>
      ) : null}
      {loadError ? (
        <Alert kind="error" testid="keys-error">
          Could not read the keys: {loadError}
        </Alert>
      ) : keys === null ? (
        <Spinner label="Loading keys…" />
      ) : keys.length === 0 ? (
        <div class="empty" data-testid="no-keys">
          <p>No key yet.</p>
          <p class="small">
            A key names who uses the relay: give each app or person their own, and you can see their usage, limit what
            they may use (models, requests at once, requests per minute), and cut one off without touching the others.
            With <code>--require-api-keys</code>, only requests with an active key are served.
          </p>
        </div>
      ) : (
        <DataTable label="API keys" columns={['Name', 'Key', 'Created', 'Last used', 'Limits', 'Status', '']}>
          {sortKeys(keys).map((k) => (
            <KeyRow
              key={k.id}
              apiKey={k}
              now={now}
              onRevoke={() => {
                setRevokeError(null);
                setConfirming(k);
              }}
            />
          ))}
        </DataTable>
      )}
      {confirming ? (
        <ConfirmDialog
          title={`Revoke “${confirming.name}”?`}
          confirmLabel="Revoke key"
          busy={revoking}
          error={revokeError}
          onConfirm={revoke}
          onCancel={() => setConfirming(null)}
          testid="revoke-dialog"
        >
          <p>
            Clients using <code>{confirming.prefix}…</code> are refused from now on. This cannot be undone: give them a new
            key instead.
          </p>
        </ConfirmDialog>
      ) : null}
    </Card>
  );
}

function KeyRow({ apiKey: k, now, onRevoke }: { apiKey: ApiKey; now: number; onRevoke: () => void }) {
  const revoked = isRevoked(k);
  return (
    <tr data-testid="key-row" data-key-id={k.id} data-key-name={k.name} data-state={revoked ? 'revoked' : 'active'} class={revoked ? 'row-muted' : ''}>
      <td>
        <strong>{k.name}</strong>
      </td>
      <td class="nowrap">
        <code data-testid="key-prefix">{k.prefix}…</code>
      </td>
      <td title={formatInstant(k.created_at)}>{formatAgo(k.created_at, now)}</td>
      <td title={formatInstant(k.last_used_at)} data-testid="key-last-used">
        {formatAgo(k.last_used_at, now)}
      </td>
      <td class="small" data-testid="key-limits">
        {limitsLabel(k)}
      </td>
      <td>
        {revoked ? (
          <span title={`Revoked ${formatInstant(k.revoked_at)}`}>
            <Badge tone="bad" testid="key-status">
              revoked
            </Badge>
          </span>
        ) : (
          <Badge tone="ok" testid="key-status">
            active
          </Badge>
        )}
      </td>
      <td class="actions-cell">
        <a class="btn btn-small" href={`#/usage?key=${encodeURIComponent(k.id)}`} aria-label={`Usage of ${k.name}`}>
          Usage
        </a>{' '}
        {revoked ? null : (
          <button type="button" class="btn btn-small btn-warn" onClick={onRevoke} aria-label={`Revoke ${k.name}`} data-testid="revoke-key">
            Revoke
          </button>
        )}
      </td>
    </tr>
  );
}
