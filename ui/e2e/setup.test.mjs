import assert from 'node:assert/strict';
import { afterEach, test } from 'node:test';
import { chat, cleanup, launchBrowser, startMockBackend, startRelay, status, waitFor } from './helpers.mjs';

afterEach(cleanup);

test('setup wizard discovers the mock backend and joins a proxy-only relay', { timeout: 150_000 }, async () => {
  const mock = await startMockBackend({ chunks: 3, chunkDelayMs: 10 });
  const proxyB = await startRelay({ args: ['serve', '--worker-secret', 'b-secret'], name: 'proxy-b' });
  // Node A: the default mode (proxy + worker), first run, discovery limited to the mock's port.
  const nodeA = await startRelay({
    name: 'node-a',
    env: { MODELRELAY_DISCOVERY_PORTS: String(mock.port) },
  });
  const { page } = await launchBrowser();

  // The bare URL, as any other local process could open it: the page asks to sign in and
  // shows nothing of the node's secrets.
  await page.goto(`${nodeA.url}/`);
  await page.getByTestId('token-prompt').waitFor();
  assert.equal(await page.getByRole('heading', { name: 'Set up this node' }).count(), 0);

  // Opened the documented way (`modelrelay dashboard`): signed in with no token step, and on a
  // first run (empty config file) the wizard opens by itself.
  await nodeA.open(page);
  await page.getByRole('heading', { name: 'Set up this node' }).waitFor();
  assert.equal(await page.getByTestId('token-prompt').count(), 0);
  assert.match(page.url(), /#\/setup$/);

  // Step 1: roles
  await page.getByLabel('Worker only').check();
  await page.getByRole('button', { name: 'Next' }).click();

  // Step 2: discovery finds the mock backend and its model
  const backend = page.locator(`[data-testid="backend-row"][data-url*=":${mock.port}"]`);
  await backend.waitFor({ timeout: 20_000 });
  assert.match(await backend.innerText(), /mock-model/);
  // This user's own server: used, and said to be theirs.
  assert.equal(await backend.getAttribute('data-usable'), 'true');
  assert.match(await backend.getByTestId('backend-owner').innerText(), /yours/);
  await page.getByRole('button', { name: 'Refresh' }).click();
  await page.getByRole('button', { name: 'Refresh' }).isEnabled();
  await backend.waitFor({ timeout: 20_000 });
  await page.getByRole('button', { name: 'Next' }).click();

  // Step 3: a wrong secret fails clearly, the right one works
  await page.getByLabel('Proxy URL').fill(proxyB.url);
  await page.getByLabel('Worker secret').fill('not-the-secret');
  await page.getByRole('button', { name: 'Test connection' }).click();
  const result = page.getByTestId('join-test-result');
  await result.waitFor({ timeout: 20_000 });
  assert.equal(await result.getAttribute('data-ok'), 'false');
  assert.match(await result.innerText(), /Connection failed\./);
  assert.ok((await result.innerText()).length > 'Connection failed. '.length + 5, 'the failure says what went wrong');

  await page.getByLabel('Worker secret').fill('b-secret');
  await page.getByRole('button', { name: 'Test connection' }).click();
  await page.locator('[data-testid="join-test-result"][data-ok="true"]').waitFor({ timeout: 20_000 });
  assert.match(await result.innerText(), /Connection works\./);

  // Joining changes where this node's worker sends its secret: the session is the owner's
  // login, so it goes through with no token step.
  await page.getByRole('button', { name: 'Join', exact: true }).click();
  await page.getByTestId('join-result').waitFor({ timeout: 20_000 });

  // Proxy B now lists node A's worker, serving the mock's model.
  await waitFor(async () => (await status(proxyB)).workers.some((w) => w.models.includes('mock-model')), {
    ms: 30_000,
    what: "node A's worker on proxy B",
  });
  await page.locator('[data-testid="join-worker-state"]', { hasText: 'connected' }).waitFor({ timeout: 20_000 });
  const answer = await chat(proxyB.url, { stream: false });
  assert.equal(answer.status, 200, answer.text);
  assert.match(answer.text, /Hello from the mock/);

  // Step 4: client snippets point at the proxy this node joined.
  await page.getByTestId('connect-next').click();
  assert.equal(await page.getByTestId('client-url').innerText(), proxyB.url);
  assert.match(await page.getByTestId('snippet-curl').innerText(), new RegExp(`${proxyB.url}/v1/chat/completions`));
  assert.match(await page.getByTestId('snippet-claude-code').innerText(), new RegExp(`ANTHROPIC_BASE_URL=${proxyB.url}`));
  await page.getByRole('button', { name: 'Go to the dashboard' }).click();
  await page.getByTestId('dashboard').waitFor();
  // A worker-only node points at the proxy it serves.
  await page.getByTestId('worker-only').waitFor();
  assert.match(await page.getByTestId('worker-only-proxy').innerText(), new RegExp(proxyB.url));

  // Saved: the settings say worker-only, joined to B.
  const settings = (await nodeA.api('/api/settings')).body;
  assert.equal(settings.settings.worker.proxy_url?.replace(/\/$/, ''), proxyB.url);
  assert.deepEqual(settings.settings.roles, { proxy: false, worker: true });
});

test('setup shows this proxy\'s join code', { timeout: 90_000 }, async () => {
  const relay = await startRelay({ args: ['serve', '--worker-secret', 'code-secret'], name: 'proxy' });
  const { page } = await launchBrowser();
  await relay.open(page, '#/setup');
  await page.getByLabel('Proxy only').check();
  await page.getByRole('button', { name: 'Next' }).click();
  await page.getByTestId('setup-step-backends').waitFor();
  await page.getByRole('button', { name: 'Next' }).click();
  const code = await page.getByTestId('own-join-code').inputValue({ timeout: 15_000 });
  assert.match(code, /^mrj1\./);
  const json = JSON.parse(Buffer.from(code.slice(5), 'base64url').toString('utf8'));
  assert.equal(json.secret, 'code-secret');
  assert.equal(json.url.replace(/\/$/, ''), relay.url);
  const settings = (await relay.api('/api/settings')).body;
  assert.deepEqual(settings.settings.roles, { proxy: true, worker: false });
});
