// Ready-to-copy client configuration for a relay URL.

export interface Snippet {
  id: string;
  title: string;
  description: string;
  language: 'shell' | 'python' | 'env';
  text: string;
}

/** Remove trailing slashes so `${base}/v1` never has a double slash. */
export function normalizeBaseUrl(url: string): string {
  return url.trim().replace(/\/+$/, '');
}

/** Single-quote a string for a POSIX shell. */
export function shellQuote(s: string): string {
  if (/^[A-Za-z0-9_@%+=:,./-]+$/.test(s)) return s;
  return `'${s.replace(/'/g, `'\\''`)}'`;
}

/** A Python string literal (JSON string syntax is valid Python for these). */
export function pyString(s: string): string {
  return JSON.stringify(s);
}

/**
 * Client configuration for the relay at `url`. Without `apiKey` the relay needs no key, and the
 * SDKs get a dummy one (they refuse to start without); with a client key (from the Keys page),
 * every snippet sends it: curl as `Authorization: Bearer`, the SDKs as their api_key, Claude Code
 * as ANTHROPIC_API_KEY.
 */
export function buildSnippets(url: string, model: string | null | undefined, apiKey?: string | null): Snippet[] {
  const base = normalizeBaseUrl(url);
  const m = model && model.trim() ? model.trim() : 'MODEL';
  const key = apiKey && apiKey.trim() ? apiKey.trim() : null;
  const sdkKey = key ?? 'anything';
  const body = JSON.stringify({ model: m, messages: [{ role: 'user', content: 'Hello!' }] });
  return [
    {
      id: 'claude-code',
      title: 'Claude Code',
      description: 'Environment variables, then run claude.',
      language: 'shell',
      text: [
        `export ANTHROPIC_BASE_URL=${shellQuote(base)}`,
        key ? `export ANTHROPIC_API_KEY=${shellQuote(key)}` : 'export ANTHROPIC_AUTH_TOKEN=anything',
        `export ANTHROPIC_MODEL=${shellQuote(m)}`,
        'claude',
      ].join('\n'),
    },
    {
      id: 'open-webui',
      title: 'Open WebUI',
      description: 'Environment of the Open WebUI container (or Settings → Connections).',
      language: 'env',
      text: [`OPENAI_API_BASE_URL=${base}/v1`, `OPENAI_API_KEY=${sdkKey}`].join('\n'),
    },
    {
      id: 'openai-python',
      title: 'OpenAI Python SDK',
      description: 'pip install openai',
      language: 'python',
      text: [
        'from openai import OpenAI',
        '',
        `client = OpenAI(base_url=${pyString(`${base}/v1`)}, api_key=${pyString(sdkKey)})`,
        'reply = client.chat.completions.create(',
        `    model=${pyString(m)},`,
        '    messages=[{"role": "user", "content": "Hello!"}],',
        ')',
        'print(reply.choices[0].message.content)',
      ].join('\n'),
    },
    {
      id: 'anthropic-python',
      title: 'Anthropic Python SDK',
      description: 'pip install anthropic',
      language: 'python',
      text: [
        'from anthropic import Anthropic',
        '',
        `client = Anthropic(base_url=${pyString(base)}, api_key=${pyString(sdkKey)})`,
        'message = client.messages.create(',
        `    model=${pyString(m)},`,
        '    max_tokens=512,',
        '    messages=[{"role": "user", "content": "Hello!"}],',
        ')',
        'print(message.content[0].text)',
      ].join('\n'),
    },
    {
      id: 'curl',
      title: 'curl',
      description: 'OpenAI Chat Completions.',
      language: 'shell',
      text: [
        `curl ${shellQuote(`${base}/v1/chat/completions`)} \\`,
        ...(key ? [`  -H ${shellQuote(`Authorization: Bearer ${key}`)} \\`] : []),
        `  -H 'Content-Type: application/json' \\`,
        `  -d ${shellQuote(body)}`,
      ].join('\n'),
    },
  ];
}

/** The equivalent command line for another box to join a proxy. */
export function workerCommand(url: string, secret: string, provider?: string | null, fingerprint?: string | null): string {
  const parts = ['modelrelay', 'worker', '--proxy-url', shellQuote(normalizeBaseUrl(url)), '--worker-secret', shellQuote(secret)];
  if (provider && provider !== 'local') parts.push('--provider', shellQuote(provider));
  if (fingerprint) parts.push('--proxy-fingerprint', shellQuote(fingerprint));
  return parts.join(' ');
}
