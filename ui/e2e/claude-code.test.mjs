// Claude Code with nothing but the URL: the Setup page's clients step says which served model
// Claude Code's requests go to, and a pick is saved as the claude-* aliases, which then win.
import assert from 'node:assert/strict';
import { afterEach, test } from 'node:test';
import { cleanup, launchBrowser, startMockBackend, startRelay, status, waitFor } from './helpers.mjs';

afterEach(cleanup);

const SECRET = 'e2e-claude-secret';

test('the clients step names the model Claude Code uses and saves a pick as aliases', { timeout: 120_000 }, async () => {
  const mock = await startMockBackend({ model: 'qwen2.5-coder-7b', chunks: 2, chunkDelayMs: 5 });
  const relay = await startRelay({ args: ['serve', '--worker-secret', SECRET], name: 'proxy' });
  await startRelay({
    name: 'worker',
    args: ['worker', '--proxy-url', relay.url, '--worker-secret', SECRET, '--backend-url', mock.url],
  });
  await waitFor(async () => (await status(relay)).models.some((m) => m.name === 'qwen2.5-coder-7b'), {
    ms: 20_000,
    what: 'the worker to serve the model',
  });
  // Claude Code's request, with no ANTHROPIC_MODEL: answered at once by the served model.
  const started = Date.now();
  const res = await fetch(`${relay.url}/v1/messages`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', 'anthropic-version': '2023-06-01', 'x-api-key': 'x' },
    body: JSON.stringify({ model: 'claude-opus-5-5', max_tokens: 16, messages: [{ role: 'user', content: 'hi' }] }),
    signal: AbortSignal.timeout(20_000),
  });
  assert.equal(res.status, 200, await res.text());
  assert.ok(Date.now() - started < 5_000, 'no queue timeout');

  const { page, consoleErrors } = await launchBrowser();
  await relay.open(page, '#/setup');
  await page.getByLabel('Proxy only').check();
  await page.getByRole('button', { name: 'Next' }).click();
  await page.getByTestId('setup-step-backends').waitFor();
  await page.getByRole('button', { name: 'Next' }).click();
  await page.getByTestId('connect-next').click();
  await page.getByTestId('setup-step-clients').waitFor();
  assert.equal(await page.getByTestId('claude-code-model').innerText(), 'qwen2.5-coder-7b');

  // The person picks (here the same model) and it is saved as the aliases that always win.
  await page.getByTestId('claude-code-change').click();
  await page.getByTestId('claude-code-pick').selectOption('qwen2.5-coder-7b');
  await page.getByRole('button', { name: 'Save' }).click();
  await page.getByText('Saved as the aliases claude-* and claude-haiku-*.').waitFor();
  const settings = (await relay.api('/api/settings')).body;
  assert.equal(settings.settings.proxy.aliases['claude-*'], 'qwen2.5-coder-7b');
  assert.equal(settings.settings.proxy.aliases['claude-haiku-*'], 'qwen2.5-coder-7b');
  assert.deepEqual(consoleErrors, []);
});
