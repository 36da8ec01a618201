// The Keys page: client API keys for inference (create, see, revoke). The pieces live under
// keys/; this file holds the list and the secret of the key just created.
import { useEffect, useMemo, useState } from 'preact/hooks';
import { api, errorMessage } from '../api';
import { ProxyOnlyNotice, isWorkerOnly } from '../components/ProxyOnlyNotice';
import { isRevoked, requiresApiKeys } from '../lib/keys';
import { useLive } from '../live';
import type { ApiKey, CreatedApiKey } from '../types';
import { CreateKeyCard } from './keys/CreateKeyCard';
import { KeysCard } from './keys/KeysCard';
import { NewKeyPanel } from './keys/NewKeyPanel';
import { RequireKeysNotice } from './keys/RequireKeysNotice';

/** The metadata of a created key, as the list shows it (the secret stays in the panel only). */
function withoutSecret({ key: _secret, ...meta }: CreatedApiKey): ApiKey {
  return meta;
}

export function Keys() {
  const { status } = useLive();
  const [keys, setKeys] = useState<ApiKey[] | null>(null);
  const [loadError, setLoadError] = useState<string | null>(null);
  // The key just created, with its secret: kept in memory until dismissed, never stored.
  const [created, setCreated] = useState<CreatedApiKey | null>(null);

  const load = () => {
    setLoadError(null);
    api
      .keys()
      .then((r) => setKeys(r.keys))
      .catch((e) => setLoadError(errorMessage(e)));
  };
  useEffect(load, []);

  const servedModels = useMemo(() => Array.from(new Set((status?.models ?? []).map((m) => m.name))).sort(), [status]);
  const relayUrl = status?.node.url ?? location.origin;
  const activeKeys = (keys ?? []).filter((k) => !isRevoked(k)).length;

  if (isWorkerOnly(status)) {
    return (
      <main class="page page-narrow" data-testid="keys">
        <h1>API keys</h1>
        <ProxyOnlyNotice status={status} what="API keys" route="keys" />
      </main>
    );
  }

  return (
    <main class="page page-narrow" data-testid="keys">
      <div class="page-title">
        <h1>API keys</h1>
      </div>
      <p class="muted page-intro">
        Keys let clients use this relay's models: each app or person gets its own, with optional limits, and its usage is
        counted.
      </p>
      {/* Until the first status arrives, nothing is known: no notice rather than a wrong one. */}
      {status ? <RequireKeysNotice required={requiresApiKeys(status)} activeKeys={activeKeys} /> : null}
      {created ? (
        <NewKeyPanel
          key={created.id}
          created={created}
          relayUrl={relayUrl}
          servedModels={servedModels}
          onDone={() => setCreated(null)}
        />
      ) : null}
      <CreateKeyCard
        servedModels={servedModels}
        onCreated={(k) => {
          setCreated(k);
          setKeys((list) => [withoutSecret(k), ...(list ?? []).filter((x) => x.id !== k.id)]);
        }}
      />
      <KeysCard
        keys={keys}
        loadError={loadError}
        onReload={load}
        onRevoked={(id, at) => {
          setKeys((list) => (list ?? []).map((k) => (k.id === id ? { ...k, revoked_at: k.revoked_at ?? at } : k)));
          // The relay's own record (its revoked_at) replaces the guess above.
          load();
        }}
      />
    </main>
  );
}
