// Step 4: ready-made client settings for the relay URL.
import { useMemo, useState } from 'preact/hooks';
import { ClaudeCodeModels } from '../../components/ClaudeCodeModels';
import { ModelSelect } from '../../components/ModelSelect';
import { Card, CopyButton } from '../../components/common';
import { SnippetList } from '../../components/SnippetList';
import { buildSnippets, normalizeBaseUrl } from '../../lib/snippets';
import { useLive } from '../../live';
import type {Discovery} from '../../types';

export function ClientsStep({
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
        <ModelSelect label="Model" value={chosen} models={models} onChange={setModel} />
      ) : (
        <p class="muted small">No model is served yet: replace MODEL with one once a worker is connected.</p>
      )}
      {live.status?.node.roles.proxy ? <ClaudeCodeModels /> : null}
      <SnippetList snippets={snippets} />
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
