import type { Snippet } from '../lib/snippets';
import { CodeBlock } from './common';

/** Ready-to-copy client snippets (lib/snippets.ts), each with a title and a copy button. */
export function SnippetList({ snippets }: { snippets: Snippet[] }) {
  return (
    <div class="snippets">
      {snippets.map((s) => (
        <div key={s.id} class="snippet" data-testid={`snippet-${s.id}`}>
          <h3>{s.title}</h3>
          <p class="muted small">{s.description}</p>
          <CodeBlock text={s.text} label={`${s.title} snippet`} />
        </div>
      ))}
    </div>
  );
}
