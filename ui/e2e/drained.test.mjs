// A node's worker and its proxy's stops: a restart of the proxy is a short outage that heals by
// itself; a drain by an admin keeps the worker away until the dashboard's one-click rejoin.

import assert from 'node:assert/strict';
import { afterEach, test } from 'node:test';
import { cleanup, launchBrowser, startMockBackend, startRelay, status, waitFor } from './helpers.mjs';

afterEach(cleanup);

const SECRET = 'e2e-drain-secret';

/** A proxy, and a node (its own proxy too) whose worker `desk-box` joined it. */
async function nodeJoinedToAProxy() {
  const mock = await startMockBackend();
  const proxy = await startRelay({ args: ['serve', '--worker-secret', SECRET], name: 'proxy' });
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
  await node.open(page);
  await page.goto(`${node.url}/dashboard`);
  await waitFor(async () => (await page.getByTestId('own-worker-state').innerText()) === 'connected', {
    what: 'the own worker to show connected',
  });
  return { proxy, page, consoleErrors };
}

const proxyAgain = (proxy) =>
  startRelay({ args: ['serve', '--worker-secret', SECRET], name: 'proxy-again', listen: `127.0.0.1:${proxy.port}` });

test('a restart of the proxy shows as a short outage and heals with no click', { timeout: 120_000 }, async () => {
  const { proxy, page, consoleErrors } = await nodeJoinedToAProxy();

  // The proxy stops the ordinary way (SIGTERM): the worker finishes, says so, and waits for it.
  await proxy.stop();
  await waitFor(async () => (await page.getByTestId('own-worker-state').innerText()) === 'disconnected', {
    ms: 20_000,
    what: 'the own worker to show disconnected',
  });
  assert.match(await page.getByTestId('own-worker-error').innerText(), /the proxy stopped.*reconnecting when it is back/);
  assert.equal(await page.getByTestId('own-worker-drained').count(), 0, 'no drained notice');
  assert.equal(await page.getByTestId('rejoin-button').count(), 0, 'nothing to click');

  // The proxy is back at the same address: the worker is back by itself within seconds.
  const back = await proxyAgain(proxy);
  const listening = Date.now();
  await waitFor(async () => (await status(back)).workers.some((w) => w.name === 'desk-box'), {
    ms: 10_000,
    what: 'the worker to come back by itself',
  });
  assert.ok(Date.now() - listening < 5_000, `back ${Date.now() - listening} ms after the proxy listened again`);
  await waitFor(async () => (await page.getByTestId('own-worker-state').innerText()) === 'connected', {
    what: 'the own worker to show connected again',
  });
  assert.equal(await page.getByTestId('own-worker-error').count(), 0, 'the outage notice is gone');
  assert.deepEqual(consoleErrors, []);
});

test('a worker an admin drained shows "drained by the proxy" and rejoins with one click', { timeout: 120_000 }, async () => {
  const { proxy, page, consoleErrors } = await nodeJoinedToAProxy();

  // An admin drains this worker on the proxy's dashboard: it finishes and stays away.
  const id = (await status(proxy)).workers.find((w) => w.name === 'desk-box').id;
  const drain = await proxy.api(`/api/workers/${id}/drain`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: '{}',
  });
  assert.equal(drain.status, 202, JSON.stringify(drain.body));
  const drained = page.getByTestId('own-worker-drained');
  await drained.waitFor({ timeout: 20_000 });
  assert.equal(await page.getByTestId('own-worker-state').innerText(), 'drained by the proxy');
  assert.match(await drained.innerText(), /drained by the proxy/);

  // Even a restarted proxy (which forgot the drain) does not bring it back by itself.
  await proxy.stop();
  const back = await proxyAgain(proxy);
  await new Promise((r) => setTimeout(r, 3000));
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
