import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { afterEach, test } from 'node:test';
import { cleanup, launchBrowser, startRelay } from './helpers.mjs';

afterEach(cleanup);

test('settings round-trip survives a reload and reaches the config file', { timeout: 90_000 }, async () => {
  const relay = await startRelay({
    args: ['serve'],
    name: 'proxy',
    config: '# written by the e2e test\n[proxy]\nmax_queue_len = 100\n',
  });
  const { page } = await launchBrowser();
  await relay.open(page, '#/settings');

  const maxQueue = page.getByLabel('Max queue length');
  await maxQueue.waitFor();
  assert.equal(await maxQueue.inputValue(), '100');
  await maxQueue.fill('42');

  await page.getByRole('button', { name: 'Add alias' }).click();
  const rows = page.getByTestId('alias-row');
  const n = await rows.count();
  await page.getByLabel(`Alias ${n} name or pattern`).fill('e2e-*');
  await page.getByLabel(`Alias ${n} model`).fill('mock-model');

  await page.getByRole('button', { name: 'Save settings' }).click();
  await page.getByTestId('settings-message').getByText(/Saved/).waitFor();

  await page.reload();
  await maxQueue.waitFor();
  assert.equal(await maxQueue.inputValue(), '42');
  const aliasNames = await page.locator('[data-testid="alias-row"] input[aria-label$="name or pattern"]').evaluateAll((els) =>
    els.map((e) => e.value),
  );
  const aliasModels = await page.locator('[data-testid="alias-row"] input[aria-label$=" model"]').evaluateAll((els) =>
    els.map((e) => e.value),
  );
  const idx = aliasNames.indexOf('e2e-*');
  assert.ok(idx >= 0, `alias kept after reload: ${aliasNames}`);
  assert.equal(aliasModels[idx], 'mock-model');

  const file = readFileSync(relay.configPath, 'utf8');
  assert.match(file, /max_queue_len\s*=\s*42/);
  assert.match(file, /["']?e2e-\*["']?\s*=\s*["']mock-model["']/);
  assert.match(file, /# written by the e2e test/, 'comments are kept');

  // The advanced editor shows the same file and the path it lives at.
  await page.getByText('Advanced: config file').click();
  assert.equal(await page.getByTestId('config-path').innerText(), relay.configPath);
  assert.match(await page.getByLabel('Config file (TOML)').inputValue(), /max_queue_len\s*=\s*42/);
});

test('settings show validation errors and invalid config files are refused', { timeout: 90_000 }, async () => {
  const relay = await startRelay({ args: ['serve'], name: 'proxy', config: '[proxy]\nmax_queue_len = 100\n' });
  const { page } = await launchBrowser();
  await relay.open(page, '#/settings');
  const maxQueue = page.getByLabel('Max queue length');
  await maxQueue.waitFor();

  await maxQueue.fill('lots');
  await page.getByRole('button', { name: 'Save settings' }).click();
  await page.getByTestId('settings-error').waitFor();
  assert.equal(await maxQueue.getAttribute('aria-invalid'), 'true');

  await maxQueue.fill('100');
  await page.getByLabel('Proxy URL').fill('http://127.0.0.1:1');
  await page.getByLabel('Listen address').fill('not an address');
  await page.getByRole('button', { name: 'Save settings' }).click();
  await page.getByTestId('settings-error').waitFor();
  assert.ok((await page.getByTestId('settings-error').innerText()).length > 0);

  await page.getByRole('button', { name: 'Revert' }).first().click();
  await page.getByText('Advanced: config file').click();
  const before = readFileSync(relay.configPath, 'utf8');
  await page.getByLabel('Config file (TOML)').fill('[proxy\nmax_queue_len = = 3\n');
  await page.getByRole('button', { name: 'Save config file' }).click();
  await page.getByTestId('config-error').waitFor();
  assert.equal(readFileSync(relay.configPath, 'utf8'), before, 'nothing written');

  await page.getByLabel('Config file (TOML)').fill('[proxy]\nmax_queue_len = 77\n');
  await page.getByRole('button', { name: 'Save config file' }).click();
  await page.getByTestId('config-message').waitFor();
  assert.equal(await maxQueue.inputValue(), '77', 'the form follows the file');
  assert.match(readFileSync(relay.configPath, 'utf8'), /max_queue_len = 77/);
});
