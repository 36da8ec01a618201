// The published runbook's addresses, /dashboard and /setup, open those pages.

import assert from 'node:assert/strict';
import { afterEach, test } from 'node:test';
import { cleanup, launchBrowser, startRelay } from './helpers.mjs';

afterEach(cleanup);

const SECRET = 'e2e-pages-secret';

test('/dashboard and /setup open the dashboard and the setup wizard', { timeout: 90_000 }, async () => {
  // A first run (empty config) would open the wizard at `/`: the path must win over that.
  const relay = await startRelay({ args: ['serve', '--worker-secret', SECRET], name: 'proxy' });
  const { page, consoleErrors } = await launchBrowser();

  await relay.open(page);

  await page.goto(`${relay.url}/dashboard`);
  await page.getByTestId('node-header').waitFor();
  assert.equal(await page.getByTestId('setup').count(), 0, 'not the wizard');
  assert.equal(new URL(page.url()).hash, '#/dashboard', 'the route moved into the hash');

  await page.goto(`${relay.url}/setup`);
  await page.getByTestId('setup').waitFor();
  assert.equal(new URL(page.url()).hash, '#/setup');

  // Navigating from there works as from `/`.
  await page.goto(`${relay.url}/setup#/dashboard`);
  await page.getByTestId('node-header').waitFor();
  assert.deepEqual(consoleErrors, []);
});
