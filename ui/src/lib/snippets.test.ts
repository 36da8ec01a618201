import { describe, expect, it } from 'vitest';
import { buildSnippets, normalizeBaseUrl, shellQuote, workerCommand } from './snippets';

const byId = (url: string, model: string | null) => Object.fromEntries(buildSnippets(url, model).map((s) => [s.id, s.text]));

describe('client snippets', () => {
  it('fill in the relay URL and the model', () => {
    const s = byId('http://10.0.0.2:8080/', 'qwen2.5-7b');
    expect(s['claude-code']).toContain('ANTHROPIC_BASE_URL=http://10.0.0.2:8080\n');
    expect(s['claude-code']).toContain('ANTHROPIC_AUTH_TOKEN=anything');
    expect(s['claude-code']).toContain('ANTHROPIC_MODEL=qwen2.5-7b');
    expect(s['open-webui']).toBe('OPENAI_API_BASE_URL=http://10.0.0.2:8080/v1\nOPENAI_API_KEY=anything');
    expect(s['openai-python']).toContain('OpenAI(base_url="http://10.0.0.2:8080/v1", api_key="anything")');
    expect(s['openai-python']).toContain('model="qwen2.5-7b"');
    expect(s['anthropic-python']).toContain('Anthropic(base_url="http://10.0.0.2:8080", api_key="anything")');
    expect(s['curl']).toContain('curl http://10.0.0.2:8080/v1/chat/completions');
    expect(s['curl']).toContain(`-d '{"model":"qwen2.5-7b","messages":[{"role":"user","content":"Hello!"}]}'`);
  });

  it('use a placeholder when no model is served', () => {
    const s = byId('http://h:1', null);
    expect(s['claude-code']).toContain('ANTHROPIC_MODEL=MODEL');
    expect(s['curl']).toContain('"model":"MODEL"');
  });

  it('quote model names for the shell and Python', () => {
    const s = byId('http://h:1', `it's "odd"`);
    expect(s['claude-code']).toContain(`ANTHROPIC_MODEL='it'\\''s "odd"'`);
    expect(s['openai-python']).toContain('model="it\'s \\"odd\\""');
    expect(s['curl']).toContain(`'{"model":"it'\\''s \\"odd\\"",`);
  });

  it('give every snippet a title and an id', () => {
    const list = buildSnippets('http://h:1', 'm');
    expect(list.map((x) => x.id)).toEqual(['claude-code', 'open-webui', 'openai-python', 'anthropic-python', 'curl']);
    for (const x of list) expect(x.title.length).toBeGreaterThan(0);
  });
});

describe('helpers', () => {
  it('normalizes base URLs', () => {
    expect(normalizeBaseUrl(' http://h:1/// ')).toBe('http://h:1');
  });
  it('quotes for the shell only when needed', () => {
    expect(shellQuote('http://h:1/v1')).toBe('http://h:1/v1');
    expect(shellQuote('a b')).toBe(`'a b'`);
    expect(shellQuote(`a'b`)).toBe(`'a'\\''b'`);
  });
  it('builds the worker command line', () => {
    expect(workerCommand('http://10.0.0.2:8080/', 'abc')).toBe(
      'modelrelay worker --proxy-url http://10.0.0.2:8080 --worker-secret abc',
    );
    expect(workerCommand('http://h:1', 's p', 'gpu')).toBe(
      `modelrelay worker --proxy-url http://h:1 --worker-secret 's p' --provider gpu`,
    );
    const pin = `sha256:${'0f'.repeat(32)}`;
    expect(workerCommand('https://h:1', 'abc', 'local', pin)).toBe(
      `modelrelay worker --proxy-url https://h:1 --worker-secret abc --proxy-fingerprint ${pin}`,
    );
  });
});

describe('snippets with a client API key', () => {
  const KEY = 'mr-AbCdEfGh123';
  const s = Object.fromEntries(buildSnippets('http://10.0.0.2:8080', 'llama3', KEY).map((x) => [x.id, x.text]));

  it('send the key as a bearer token with curl', () => {
    expect(s['curl']).toBe(
      [
        'curl http://10.0.0.2:8080/v1/chat/completions \\',
        `  -H 'Authorization: Bearer ${KEY}' \\`,
        `  -H 'Content-Type: application/json' \\`,
        `  -d '{"model":"llama3","messages":[{"role":"user","content":"Hello!"}]}'`,
      ].join('\n'),
    );
  });

  it('give the key to the SDKs and to Claude Code', () => {
    expect(s['openai-python']).toContain(`OpenAI(base_url="http://10.0.0.2:8080/v1", api_key="${KEY}")`);
    expect(s['anthropic-python']).toContain(`Anthropic(base_url="http://10.0.0.2:8080", api_key="${KEY}")`);
    expect(s['claude-code']).toContain(`export ANTHROPIC_BASE_URL=http://10.0.0.2:8080\nexport ANTHROPIC_API_KEY=${KEY}\n`);
    expect(s['claude-code']).not.toContain('ANTHROPIC_AUTH_TOKEN');
    expect(s['open-webui']).toBe(`OPENAI_API_BASE_URL=http://10.0.0.2:8080/v1\nOPENAI_API_KEY=${KEY}`);
  });

  it('leave the key out when there is none', () => {
    for (const text of buildSnippets('http://h:1', 'm', '  ').map((x) => x.text)) expect(text).not.toContain('Bearer');
  });
});
