// The secret of a key just created: the relay shows it this once, so it is shown big, with a copy
// button and client snippets that already carry it.
import { useEffect, useRef, useState } from 'preact/hooks';
import { Alert, CopyButton } from '../../components/common';
import { SnippetList } from '../../components/SnippetList';
import { snippetModel } from '../../lib/keys';
import { buildSnippets, normalizeBaseUrl } from '../../lib/snippets';
import type { CreatedApiKey } from '../../types';

export function NewKeyPanel({
  created,
  relayUrl,
  servedModels,
  onDone,
}: {
  created: CreatedApiKey;
  relayUrl: string;
  servedModels: string[];
  onDone: () => void;
}) {
  // A key limited to some models can only use those; otherwise any model the relay serves.
  const choices = created.models && created.models.length ? created.models : servedModels;
  const [model, setModel] = useState<string>(snippetModel(created.models, servedModels) ?? '');
  const snippets = buildSnippets(relayUrl, model || null, created.key);
  const panel = useRef<HTMLElement>(null);
  // Screen readers and keyboards land on the secret at once, not on the emptied form.
  useEffect(() => {
    panel.current?.focus();
    panel.current?.scrollIntoView?.({ block: 'start' });
  }, [created.id]);

  return (
    <section class="card new-key" data-testid="new-key" aria-labelledby="new-key-title" tabIndex={-1} ref={panel}>
      <header class="card-header">
        <h2 id="new-key-title">Key “{created.name}” created</h2>
      </header>
      <Alert kind="warning">
        <strong>Copy the key now: it is shown only this once.</strong> The relay keeps only a hash of it; if it is lost,
        revoke it and create another.
      </Alert>
      <div class="secret-row">
        <code class="secret" data-testid="new-key-secret" aria-label="The new API key">
          {created.key}
        </code>
        <CopyButton text={created.key} label="Copy the API key" testid="copy-new-key" />
      </div>
      <h3>Use it</h3>
      <p class="muted small">
        Relay URL <code>{normalizeBaseUrl(relayUrl)}</code>. Clients send the key as <code>Authorization: Bearer</code>{' '}
        (OpenAI clients) or <code>x-api-key</code> (Anthropic clients).
      </p>
      {choices.length > 1 ? (
        <label class="field field-inline">
          <span>Model</span>
          <select value={model} onChange={(e) => setModel((e.target as HTMLSelectElement).value)} data-testid="new-key-model">
            {choices.map((m) => (
              <option key={m} value={m}>
                {m}
              </option>
            ))}
          </select>
        </label>
      ) : null}
      <SnippetList snippets={snippets} />
      <div class="row-end">
        <button type="button" class="btn btn-primary" onClick={onDone} data-testid="new-key-done">
          I have copied it
        </button>
      </div>
    </section>
  );
}
