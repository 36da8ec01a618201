import assert from 'node:assert/strict';
import { afterEach, test } from 'node:test';
import { cleanup, freePort, launchBrowser, startRelay } from './helpers.mjs';

afterEach(cleanup);

const TOKEN = 'e2e-admin-token-0123456';

test('beyond loopback the UI signs in with the admin token and keeps only a session cookie', { timeout: 90_000 }, async () => {
  const port = await freePort();
  const relay = await startRelay({
    args: ['serve'],
    name: 'proxy',
    listen: `0.0.0.0:${port}`,
    env: { MODELRELAY_ADMIN_TOKEN: TOKEN },
    adminToken: TOKEN,
    config: '[proxy]\n',
  });
  const open = await fetch(`${relay.url}/api/status`, { signal: AbortSignal.timeout(5000) });
  assert.equal(open.status, 401);

  const { page, context } = await launchBrowser();
  await page.goto(`${relay.url}/#/dashboard`);
  const prompt = page.getByTestId('token-prompt');
  await prompt.waitFor();

  await page.getByLabel('Admin token', { exact: true }).fill('wrong-token');
  await page.getByRole('button', { name: 'Sign in' }).click();
  await page.getByTestId('token-error').getByText(/refused/).waitFor();
  assert.ok(await prompt.isVisible());

  await page.getByLabel('Admin token', { exact: true }).fill(TOKEN);
  await page.getByRole('button', { name: 'Sign in' }).click();
  await prompt.waitFor({ state: 'detached' });
  await page.getByTestId('node-url').waitFor();
  await page.locator('[data-testid="connection-status"][data-state="live"]').waitFor();
  // The page keeps no token: the session is an HttpOnly cookie its scripts cannot read.
  const stored = await page.evaluate(() => JSON.stringify({ ...localStorage }) + document.cookie);
  assert.ok(!stored.includes(TOKEN), stored);
  const cookies = await context.cookies(relay.url);
  const session = cookies.find((c) => c.name === `modelrelay_session_${port}`);
  assert.ok(session, JSON.stringify(cookies));
  assert.equal(session.httpOnly, true);
  assert.equal(session.sameSite, 'Strict');

  // The session holds after a reload, for the settings page too.
  await page.goto(`${relay.url}/#/settings`);
  await page.reload();
  await page.getByLabel('Max queue length').waitFor();
  assert.equal(await prompt.count(), 0);
});
