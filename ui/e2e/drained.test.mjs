// A node whose worker its proxy drained (graceful_shutdown) shows it and rejoins with one click.

import assert from 'node:assert/strict';
import { afterEach, test } from 'node:test';
import { cleanup, launchBrowser, startMockBackend, startRelay, status, waitFor } from './helpers.mjs';

afterEach(cleanup);

const SECRET = 'e2e-drain-secret';

test('a worker its proxy drained shows "drained by the proxy" and rejoins with one click', { timeout: 120_000 }, async () => {
  const mock = await startMockBackend();
  const proxy = await startRelay({ args: ['serve', '--worker-secret', SECRET], name: 'proxy' });
  // A node (its own proxy too) whose worker joins the proxy above.
  const node = await startRelay({
    args: ['--proxy-url', proxy.url, '--worker-secret', SECRET, '--backend-url', mock.url, '--worker-name', 'desk-box'],
    name: 'node',
    config: '[roles]\nproxy = true\nworker = true\n',
  });
  await waitFor(async () => (await status(proxy)).workers.some((w) => w.name === 'desk-box'), {
    ms: 20_000,
    what: 'the node worker to join the proxy',
  });
  const { page, consoleErrors } = await launchBrowser();
  await page.goto(`${node.url}/dashboard`);
  await waitFor(async () => (await page.getByTestId('own-worker-state').innerText()) === 'connected', {
    what: 'the own worker to show connected',
  });

  // The proxy shuts down: it sends graceful_shutdown; the worker finishes and waits.
  await proxy.stop();
  const drained = page.getByTestId('own-worker-drained');
  await drained.waitFor({ timeout: 20_000 });
  assert.equal(await page.getByTestId('own-worker-state').innerText(), 'drained by the proxy');
  assert.match(await drained.innerText(), /drained by the proxy/);

  // The proxy is back at the same address; the worker stays drained until asked.
  const back = await startRelay({
    args: ['serve', '--worker-secret', SECRET],
    name: 'proxy-again',
    listen: `127.0.0.1:${proxy.port}`,
  });
  await new Promise((r) => setTimeout(r, 1000));
  assert.equal((await status(back)).workers.length, 0, 'no reconnect by itself');

  await page.getByTestId('rejoin-button').click();
  await waitFor(async () => (await status(back)).workers.some((w) => w.name === 'desk-box'), {
    ms: 20_000,
    what: 'the worker to rejoin',
  });
  await waitFor(async () => (await page.getByTestId('own-worker-state').innerText()) === 'connected', {
    what: 'the own worker to show connected again',
  });
  assert.equal(await drained.count(), 0, 'the drained notice is gone');
  assert.deepEqual(consoleErrors, []);
});
