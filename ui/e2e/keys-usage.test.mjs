// Client API keys and usage, through the UI against the real relay: a key created on the Keys
// page works for inference when keys are required, is shown once, and is refused once revoked;
// the Usage page shows the traffic sent (totals, per-key rows) and exports it as CSV.
import assert from 'node:assert/strict';
import { mkdirSync, readFileSync } from 'node:fs';
import path from 'node:path';
import { afterEach, test } from 'node:test';
import { ARTIFACTS, chat, cleanup, freePort, launchBrowser, startMockBackend, startRelay, status, waitFor } from './helpers.mjs';

afterEach(cleanup);

const SECRET = 'e2e-worker-secret';
const count = (text) => Number(text.replace(/[^0-9]/g, ''));

async function relayWithWorker(mock, extraArgs = [], relayOptions = {}) {
  const relay = await startRelay({ args: ['serve', '--worker-secret', SECRET, ...extraArgs], name: 'proxy', ...relayOptions });
  await startRelay({
    name: 'worker',
    args: ['worker', '--proxy-url', relay.url, '--worker-secret', SECRET, '--backend-url', mock.url, '--worker-name', 'e2e-worker'],
  });
  await waitFor(async () => (await status(relay)).models.some((m) => m.name === 'mock-model'), {
    ms: 20_000,
    what: 'the worker to serve mock-model',
  });
  return relay;
}

/** Create a key on the Keys page; resolves to the secret the panel shows. */
async function createKey(page, name, { models = '' } = {}) {
  await page.getByLabel('Name', { exact: true }).fill(name);
  if (models) await page.getByLabel('Allowed models (optional)').fill(models);
  await page.getByRole('button', { name: 'Create key' }).click();
  const panel = page.getByTestId('new-key');
  await panel.waitFor();
  return (await panel.getByTestId('new-key-secret').innerText()).trim();
}

test('a key created on the Keys page is shown once, works when keys are required, and is refused once revoked', { timeout: 150_000 }, async () => {
  const mock = await startMockBackend({ chunks: 3, chunkDelayMs: 10 });
  const relay = await relayWithWorker(mock, ['--require-api-keys']);
  const { page, context, consoleErrors } = await launchBrowser();
  await context.grantPermissions(['clipboard-read', 'clipboard-write'], { origin: relay.url });

  // The dashboard says keys are required and leads to the Keys page.
  await relay.open(page, '#/dashboard');
  const keysFact = page.getByTestId('node-api-keys');
  await keysFact.getByText('required', { exact: true }).waitFor();
  await keysFact.getByRole('link').click();

  // Keys are required and none exists: the page says so, and a request without a key is refused.
  await page.getByTestId('keys-required').waitFor();
  assert.match(await page.evaluate(() => location.hash), /^#\/keys$/);
  await page.getByTestId('no-keys').waitFor();
  assert.equal((await chat(relay.url, { stream: false })).status, 401);

  // The form checks a field before asking the relay.
  await page.getByLabel('Name', { exact: true }).fill('e2e-app');
  await page.getByLabel('Concurrent requests (optional)').fill('0');
  await page.getByRole('button', { name: 'Create key' }).click();
  await page.getByText('Concurrent requests must be at least 1').waitFor();
  await page.getByLabel('Concurrent requests (optional)').fill('');
  // Signed in (the documented way), a key is made without any token step.
  await page.getByLabel('Requests per minute (optional)').fill('2000000');
  await page.getByRole('button', { name: 'Create key' }).click();
  assert.equal(await page.getByTestId('token-prompt').count(), 0);
  // What only the relay knows (its upper bound) comes back as its own message.
  await page.getByTestId('create-key-error').getByText('`requests_per_minute` must be 1 to 1000000').waitFor();
  await page.getByLabel('Requests per minute (optional)').fill('');

  const secret = await createKey(page, 'e2e-app');
  assert.match(secret, /^mr-\S{16,}$/);

  // Copy puts exactly the secret on the clipboard.
  await page.getByRole('button', { name: 'Copy the API key' }).click();
  await page.getByTestId('new-key').getByRole('button', { name: 'Copy the API key' }).getByText('Copied').waitFor();
  assert.equal(await page.evaluate(() => navigator.clipboard.readText()), secret);

  // The snippets carry the key and the relay's URL.
  const snippet = async (id) => page.getByTestId(`snippet-${id}`).locator('pre').innerText();
  assert.match(await snippet('curl'), new RegExp(`-H 'Authorization: Bearer ${secret}'`));
  assert.ok((await snippet('curl')).includes(`${relay.url}/v1/chat/completions`));
  assert.ok((await snippet('openai-python')).includes(`OpenAI(base_url="${relay.url}/v1", api_key="${secret}")`));
  assert.ok((await snippet('claude-code')).includes(`export ANTHROPIC_BASE_URL=${relay.url}\nexport ANTHROPIC_API_KEY=${secret}`));
  assert.ok((await snippet('anthropic-python')).includes(`api_key="${secret}"`));
  mkdirSync(ARTIFACTS, { recursive: true });
  await page.screenshot({ path: path.join(ARTIFACTS, 'keys-created.png'), fullPage: true });

  // The key works for inference; the list shows it with its prefix, active.
  const ok = await chat(relay.url, { stream: false, apiKey: secret });
  assert.equal(ok.status, 200, ok.text);
  assert.match(JSON.parse(ok.text).choices[0].message.content, /Hello from the mock/);
  const row = page.locator('[data-testid="key-row"][data-key-name="e2e-app"]');
  await row.waitFor();
  const prefix = (await row.getByTestId('key-prefix').innerText()).replace(/…$/, '');
  assert.ok(prefix.length >= 4 && secret.startsWith(prefix), `prefix ${prefix} of ${secret}`);
  assert.equal(await row.getByTestId('key-status').innerText(), 'active');
  // Last used is recorded as the request is admitted: the list shows it once reloaded.
  await waitFor(
    async () => {
      await page.getByRole('button', { name: 'Reload' }).click();
      return (await row.getByTestId('key-last-used').innerText()) !== 'never';
    },
    { interval: 500, what: 'last used to be set' },
  );

  // Shown once: the list API never has the secret, and after a reload the page has it nowhere.
  const listed = await relay.api('/api/keys');
  assert.equal(listed.status, 200);
  assert.ok(!JSON.stringify(listed.body).includes(secret), 'GET /api/keys must not return the secret');
  await page.getByRole('button', { name: 'I have copied it' }).click();
  await page.getByTestId('new-key').waitFor({ state: 'detached' });
  await page.reload();
  await row.waitFor();
  assert.ok(!(await page.content()).includes(secret), 'the secret is gone after a reload');

  // Revoke, after confirming; the key is then refused.
  await row.getByRole('button', { name: 'Revoke e2e-app' }).click();
  const dialog = page.getByTestId('revoke-dialog');
  await dialog.waitFor();
  // Keyboard: focus starts on Cancel (moved there once the dialog has rendered), Escape closes,
  // and focus goes back to the Revoke button.
  await waitFor(async () => (await page.evaluate(() => document.activeElement?.textContent)) === 'Cancel', {
    ms: 5_000,
    what: 'focus to move to the dialog\'s Cancel button',
  });
  await page.keyboard.press('Escape');
  await dialog.waitFor({ state: 'detached' });
  assert.equal(await page.evaluate(() => document.activeElement?.getAttribute('aria-label')), 'Revoke e2e-app');
  assert.equal(await row.getByTestId('key-status').innerText(), 'active');
  await row.getByRole('button', { name: 'Revoke e2e-app' }).click();
  await dialog.getByRole('button', { name: 'Revoke key' }).click();
  await page.getByTestId('keys-message').getByText(/Revoked “e2e-app”/).waitFor();
  await waitFor(async () => (await row.getAttribute('data-state')) === 'revoked', { what: 'the row to show revoked' });
  assert.equal(await row.getByTestId('key-status').innerText(), 'revoked');
  assert.equal(await row.getByRole('button', { name: 'Revoke e2e-app' }).count(), 0);
  const refused = await chat(relay.url, { stream: false, apiKey: secret });
  assert.equal(refused.status, 401, refused.text);
  await page.screenshot({ path: path.join(ARTIFACTS, 'keys-revoked.png'), fullPage: true });

  // The browser logs the refusals this test asks for (the 403 before the token, the 400 above);
  // nothing else may fail.
  assert.deepEqual(consoleErrors.filter((e) => !/status of (400 \(Bad Request\)|403 \(Forbidden\))/.test(e)), []);
});

test('the Usage page shows the traffic sent, per key, and exports it as CSV', { timeout: 150_000 }, async () => {
  const mock = await startMockBackend({ chunks: 3, chunkDelayMs: 10 });
  const relay = await relayWithWorker(mock);
  const { page, context, consoleErrors } = await launchBrowser();

  await relay.open(page, '#/usage');
  await page.getByTestId('usage-empty').waitFor();

  await page.goto(`${relay.url}/#/keys`);
  await page.getByTestId('keys-not-required').waitFor();
  const secret = await createKey(page, 'usage-app');
  const keyId = await page.locator('[data-testid="key-row"][data-key-name="usage-app"]').getAttribute('data-key-id');

  // Two requests with the key (one streamed), one without.
  for (const r of [
    await chat(relay.url, { stream: false, apiKey: secret }),
    await chat(relay.url, { stream: true, apiKey: secret }),
    await chat(relay.url, { stream: false }),
  ]) {
    assert.equal(r.status, 200, r.text);
  }
  // Usage is written after each answer: wait for the API to count all three.
  await waitFor(async () => (await relay.api('/api/usage')).body?.totals?.requests === 3, { what: 'usage to count 3 requests' });

  await page.goto(`${relay.url}/#/usage`);
  await page.getByTestId('usage-total-requests').waitFor();
  assert.equal(count(await page.getByTestId('usage-total-requests').innerText()), 3);
  assert.equal(count(await page.getByTestId('usage-total-errors').innerText()), 0);
  assert.ok(count(await page.getByTestId('usage-total-input').innerText()) > 0, 'input tokens counted');
  assert.ok(count(await page.getByTestId('usage-total-output').innerText()) > 0, 'output tokens counted');
  assert.equal(Number(await page.getByTestId('usage-chart-requests').getAttribute('data-sum')), 3);
  assert.ok(Number(await page.getByTestId('usage-chart-tokens').getAttribute('data-sum')) > 0);

  // Per key: the key's row (by name) has its two requests; the request without a key has its own row.
  await page.getByTestId('usage-group-by').getByText('Key', { exact: true }).click();
  const keyRow = page.locator(`[data-testid="usage-row"][data-group="${keyId}"]`);
  await keyRow.waitFor();
  assert.match(await keyRow.innerText(), /usage-app/);
  assert.equal(count(await keyRow.getByTestId('usage-row-requests').innerText()), 2);
  const anonymous = page.locator('[data-testid="usage-row"][data-group="anonymous"]');
  assert.equal(count(await anonymous.getByTestId('usage-row-requests').innerText()), 1);
  assert.match(await page.evaluate(() => location.hash), /group_by=key/);

  // Per model.
  await page.getByTestId('usage-group-by').getByText('Model', { exact: true }).click();
  const modelRow = page.locator('[data-testid="usage-row"][data-group="mock-model"]');
  await modelRow.waitFor();
  assert.equal(count(await modelRow.getByTestId('usage-row-requests').innerText()), 3);
  // A model's name narrows the page to it, per day, and the address keeps the filter.
  await modelRow.getByTestId('usage-row-show').click();
  await page.locator('[data-testid="usage-row"][data-group]').first().waitFor();
  await waitFor(async () => (await page.getByTestId('usage-model').inputValue()) === 'mock-model', { what: 'the model filter' });
  assert.match(await page.evaluate(() => location.hash), /^#\/usage\?model=mock-model$/);
  assert.equal(await page.getByRole('radio', { name: 'Day' }).isChecked(), true);

  // Filtering by the key narrows the totals to its requests.
  await page.getByRole('combobox', { name: 'Key' }).selectOption(keyId);
  await waitFor(async () => count(await page.getByTestId('usage-total-requests').innerText()) === 2, { what: 'totals for the key' });
  mkdirSync(ARTIFACTS, { recursive: true });
  await page.screenshot({ path: path.join(ARTIFACTS, 'usage.png'), fullPage: true });

  // The export downloads the same rows as CSV, with a header line.
  await page.getByTestId('usage-group-by').getByText('Key', { exact: true }).click();
  await keyRow.waitFor();
  const [download] = await Promise.all([page.waitForEvent('download'), page.getByRole('button', { name: 'Export CSV' }).click()]);
  assert.match(download.suggestedFilename(), /^usage-by-key-.*\.csv$/);
  const file = path.join(ARTIFACTS, 'usage-export.csv');
  await download.saveAs(file);
  const lines = readFileSync(file, 'utf8').trim().split(/\r?\n/);
  assert.match(lines[0], /requests/);
  assert.equal(lines.length, 2, `one key row under the header:\n${lines.join('\n')}`);
  assert.ok(lines[1].includes(keyId), lines[1]);

  // New traffic shows up by itself (the page follows the live feed's request count).
  assert.equal((await chat(relay.url, { stream: false, apiKey: secret })).status, 200);
  await waitFor(async () => count(await keyRow.getByTestId('usage-row-requests').innerText()) === 3, {
    ms: 25_000,
    what: 'the key row to count the new request without a click',
  });

  assert.deepEqual(consoleErrors, []);
  await context.close();
});

test('beyond loopback, the Keys page and the CSV export work with the admin token', { timeout: 150_000 }, async () => {
  const TOKEN = 'e2e-admin-token-keys';
  const mock = await startMockBackend({ chunks: 3, chunkDelayMs: 10 });
  const port = await freePort();
  const relay = await relayWithWorker(mock, [], {
    listen: `0.0.0.0:${port}`,
    env: { MODELRELAY_ADMIN_TOKEN: TOKEN },
    adminToken: TOKEN,
  });
  assert.equal((await fetch(`${relay.url}/api/keys`, { signal: AbortSignal.timeout(5000) })).status, 401);
  const { page, consoleErrors } = await launchBrowser();

  await page.goto(`${relay.url}/#/keys`);
  await page.getByTestId('token-prompt').waitFor();
  await page.getByLabel('Admin token', { exact: true }).fill(TOKEN);
  await page.getByRole('button', { name: 'Sign in' }).click();
  await page.getByTestId('no-keys').waitFor();
  const secret = await createKey(page, 'remote-app');
  assert.equal((await chat(relay.url, { stream: false, apiKey: secret })).status, 200);
  await waitFor(async () => (await relay.api('/api/usage')).body?.totals?.requests === 1, { what: 'usage to count the request' });

  // The CSV is fetched with the session.
  await page.goto(`${relay.url}/#/usage?group_by=model`);
  await page.locator('[data-testid="usage-row"][data-group="mock-model"]').waitFor();
  const [download] = await Promise.all([page.waitForEvent('download'), page.getByRole('button', { name: 'Export CSV' }).click()]);
  const file = path.join(ARTIFACTS, 'usage-export-token.csv');
  mkdirSync(ARTIFACTS, { recursive: true });
  await download.saveAs(file);
  const lines = readFileSync(file, 'utf8').trim().split(/\r?\n/);
  assert.match(lines[0], /^model,/);
  assert.match(lines[1], /^mock-model,,1,0,/);
  // The browser logs the first, token-less 401 that brought up the prompt.
  assert.deepEqual(consoleErrors.filter((e) => !/status of 401/.test(e)), []);
});
