import assert from 'node:assert/strict';
import { mkdirSync } from 'node:fs';
import path from 'node:path';
import { afterEach, test } from 'node:test';
import { ARTIFACTS, chat, cleanup, freePort, launchBrowser, startMockBackend, startRelay, status, waitFor } from './helpers.mjs';

afterEach(cleanup);

const SECRET = 'e2e-worker-secret';
const count = (text) => Number(text.replace(/[^0-9]/g, ''));

async function relayWithWorker(mock) {
  const relay = await startRelay({ args: ['serve', '--worker-secret', SECRET], name: 'proxy' });
  await startRelay({
    name: 'worker',
    args: ['worker', '--proxy-url', relay.url, '--worker-secret', SECRET, '--backend-url', mock.url, '--worker-name', 'e2e-worker', '--max-concurrency', '4'],
  });
  await waitFor(async () => (await status(relay)).workers.some((w) => w.name === 'e2e-worker' && w.models.includes('mock-model')), {
    ms: 20_000,
    what: 'the worker to register with mock-model',
  });
  return relay;
}

test('the request view says what cost routing weighed when it sent a long prompt to the faster box', { timeout: 120_000 }, async () => {
  // Two boxes of one model: "slow-box" evaluates prompts at 400 tokens a second and generates
  // 20, "fast-box" 8,000 and 40 (each backend's timings say so with every answer).
  const slow = await startMockBackend({ chunks: 10, chunkDelayMs: 50, promptTps: 400 });
  const fast = await startMockBackend({ chunks: 200, chunkDelayMs: 25, promptTps: 8000 });
  const relay = await startRelay({ args: ['serve', '--worker-secret', SECRET], name: 'proxy' });
  for (const [name, mock] of [['slow-box', slow], ['fast-box', fast]]) {
    await startRelay({
      name,
      args: ['worker', '--proxy-url', relay.url, '--worker-secret', SECRET, '--backend-url', mock.url, '--worker-name', name, '--max-concurrency', '4'],
    });
    // One at a time: the first registered is the usual rules' first choice among equals.
    await waitFor(async () => (await status(relay)).workers.some((w) => w.name === name), { ms: 20_000, what: `${name} to register` });
  }
  // Two conversations measure both boxes (the usual rules spread new conversations).
  const words = (n, tag) => `${tag} ${'word '.repeat(n)}`;
  for (const tag of ['first', 'second']) {
    assert.equal((await chat(relay.url, { content: words(200, tag) })).status, 200);
  }
  await waitFor(async () => (await status(relay)).workers.every((w) => Object.keys(w.speeds).length > 0), {
    what: 'both boxes measured',
  });

  const { page, consoleErrors } = await launchBrowser();
  await relay.open(page, '#/dashboard');
  await page.locator('[data-testid="connection-status"][data-state="live"]').waitFor();
  // A long new conversation: about 5 s of prompt on slow-box, a fraction of a second on fast-box.
  const answer = chat(relay.url, { content: words(2000, 'third') });
  const row = page.locator('[data-testid="in-flight-row"][data-state="running"]');
  await row.first().waitFor({ timeout: 15_000 });
  assert.equal(await row.first().getByTestId('in-flight-worker').innerText(), 'fast-box');
  assert.match(await row.first().getByTestId('in-flight-reason').innerText(), /faster box \(measured\)/);
  const weighed = await row.first().getByTestId('in-flight-weighed').innerText();
  // In a quiet fleet the answer's end is weighed too: fast-box generates twice as fast.
  assert.match(weighed, /^first token ≈ \d+(\.\d)? s here, ≈ \d+(\.\d)? s on slow-box · answer ≈ \d+(\.\d)? s sooner here$/);
  const [here, there] = [...weighed.matchAll(/≈ ([\d.]+) s/g)].map((m) => Number(m[1]));
  assert.ok(there > 4 * (here ?? 0), `${weighed}: slow-box's estimate is several times fast-box's`);
  // The placements since start, counted by reason, under the table.
  await waitFor(async () => /faster box 1\b/.test(await page.getByTestId('placement-counts').innerText()), {
    what: 'the faster-box placement counted',
  });
  assert.match(await page.getByTestId('placement-counts').innerText(), /^Placed since start: new conversation 2 · faster box 1 · cost routing on$/);
  mkdirSync(ARTIFACTS, { recursive: true });
  await page.screenshot({ path: path.join(ARTIFACTS, 'dashboard-weighed.png'), fullPage: true });
  assert.equal((await answer).status, 200);
  assert.deepEqual(consoleErrors, []);
});

test('dashboard shows connected workers and live traffic', { timeout: 120_000 }, async () => {
  const mock = await startMockBackend({ chunks: 30, chunkDelayMs: 150 });
  const relay = await relayWithWorker(mock);
  const { page, consoleErrors } = await launchBrowser();

  await relay.open(page, '#/dashboard');
  const row = page.locator('[data-testid="worker-row"][data-worker-name="e2e-worker"]');
  await row.waitFor();
  assert.match(await row.getByTestId('worker-models').innerText(), /mock-model/);
  assert.equal(await row.getByTestId('worker-state').innerText(), 'idle');
  assert.match(await row.getByTestId('worker-load').innerText(), /0 \/ 4/);
  await page.locator('[data-testid="model-row"][data-model="mock-model"]').waitFor();
  assert.match(await page.getByTestId('node-url').innerText(), new RegExp(`127\\.0\\.0\\.1:${relay.port}`));
  await page.locator('[data-testid="connection-status"][data-state="live"]').waitFor();

  // A marker that a reload would wipe: everything below must arrive live.
  await page.evaluate(() => {
    window.__e2eMarker = 'no-reload';
  });
  const before = count(await page.getByTestId('total-requests').innerText());

  const requests = [chat(relay.url), chat(relay.url), chat(relay.url)];

  const inflight = page.locator('[data-testid="in-flight-row"][data-state="running"]');
  await waitFor(async () => (await inflight.count()) === 3, { ms: 15_000, what: 'three running requests on the dashboard' });
  assert.equal(await inflight.first().getByTestId('in-flight-worker').innerText(), 'e2e-worker');
  assert.match(await inflight.first().innerText(), /mock-model/);
  await waitFor(async () => /^3 \/ 4/.test(await row.getByTestId('worker-load').innerText()), { what: 'worker load 3 / 4' });
  assert.equal(await row.getByTestId('worker-state').innerText(), 'busy');
  // tokens stream in: the token count of a running request grows
  await waitFor(async () => Number(await inflight.first().getByTestId('in-flight-tokens').innerText()) >= 3, {
    what: 'tokens counted',
  });
  // and each running request says why it went to its worker
  assert.match(await inflight.first().getByTestId('in-flight-reason').innerText(), /new conversation|cache hit|least loaded/);

  mkdirSync(ARTIFACTS, { recursive: true });
  await page.screenshot({ path: path.join(ARTIFACTS, 'dashboard.png'), fullPage: true });

  const answers = await Promise.all(requests);
  for (const a of answers) {
    assert.equal(a.status, 200);
    assert.match(a.text, /data: \[DONE\]/);
  }

  await page.getByTestId('no-in-flight').waitFor({ timeout: 10_000 });
  await waitFor(async () => count(await page.getByTestId('total-requests').innerText()) >= before + 3, {
    what: 'total requests to grow by 3',
  });
  await waitFor(async () => count(await page.getByTestId('total-tokens').innerText()) > 0, { what: 'total tokens' });
  // The three requests are one conversation (the same prompt): the first found no home, the
  // other two were routed to its worker.
  const affinity = page.getByTestId('affinity-hits');
  await waitFor(async () => Number(await affinity.getAttribute('data-hits')) >= 2, { what: 'affinity hits counted' });
  assert.equal(await affinity.getAttribute('data-new'), '1');
  assert.match(await affinity.innerText(), /100%/);
  const chart = page.getByTestId('chart-requests');
  await waitFor(async () => Number(await chart.getAttribute('data-sum')) >= 3, { what: 'the requests/s chart to count the requests' });
  assert.ok(Number(await page.getByTestId('chart-tokens').getAttribute('data-max')) > 0, 'tokens/s chart shows traffic');
  assert.ok(Number(await chart.getAttribute('data-points')) >= 2);
  assert.equal(await row.getByTestId('worker-state').innerText(), 'idle');

  // Refresh models reaches the worker.
  await page.getByRole('button', { name: 'Refresh models' }).click();
  await page.getByTestId('workers-message').getByText(/Asked 1 worker/).waitFor();

  assert.equal(await page.evaluate(() => window.__e2eMarker), 'no-reload', 'the page was not reloaded');
  assert.deepEqual(
    consoleErrors.filter((e) => !/lifecycle/.test(e) && !/404/.test(e)),
    [],
    'no console errors',
  );
});

test('draining a worker from the dashboard', { timeout: 120_000 }, async () => {
  const mock = await startMockBackend({ chunks: 20, chunkDelayMs: 150 });
  const relay = await relayWithWorker(mock);
  const { page } = await launchBrowser();

  await relay.open(page, '#/dashboard');
  const row = page.locator('[data-testid="worker-row"][data-worker-name="e2e-worker"]');
  await row.waitFor();

  // A request in flight lets the draining state be seen before the worker goes.
  const running = chat(relay.url);
  await page.locator('[data-testid="in-flight-row"][data-state="running"]').waitFor();

  await page.getByRole('button', { name: 'Drain e2e-worker' }).click();
  await page.getByTestId('workers-message').getByText(/Draining e2e-worker/).waitFor();
  await waitFor(async () => (await row.count()) === 0 || (await row.getAttribute('data-state')) === 'draining', {
    what: 'the worker to show as draining',
  });
  if ((await row.count()) > 0) {
    assert.equal(await row.getByTestId('worker-state').innerText(), 'draining');
    assert.ok(await row.getByRole('button', { name: 'Drain e2e-worker' }).isDisabled(), 'no second drain');
  }

  // The running request still finishes, then the worker leaves and stays away.
  const answer = await running;
  assert.equal(answer.status, 200);
  assert.match(answer.text, /data: \[DONE\]/);
  await row.waitFor({ state: 'detached', timeout: 15_000 });
  await page.getByTestId('no-workers').waitFor();
  await new Promise((r) => setTimeout(r, 2000));
  const s = await status(relay);
  assert.deepEqual(
    s.workers.filter((w) => w.name === 'e2e-worker' && w.state !== 'draining'),
    [],
    'the drained worker did not rejoin',
  );
});

test('dashboard shows reconnecting while the relay is away and recovers', { timeout: 120_000 }, async () => {
  const port = await freePort();
  const first = await startRelay({ args: ['serve'], name: 'proxy-1', listen: `127.0.0.1:${port}` });
  const { page } = await launchBrowser();
  await first.open(page, '#/dashboard');
  await page.locator('[data-testid="connection-status"][data-state="live"]').waitFor();
  await page.evaluate(() => {
    window.__e2eMarker = 'no-reload';
  });

  await first.stop();
  const indicator = page.locator('[data-testid="connection-status"][data-state="reconnecting"]');
  await indicator.waitFor({ timeout: 15_000 });
  assert.match(await indicator.innerText(), /Reconnecting/);

  const second = await startRelay({ args: ['serve'], name: 'proxy-2', listen: `127.0.0.1:${port}` });
  await page.locator('[data-testid="connection-status"][data-state="live"]').waitFor({ timeout: 30_000 });
  // The feed is back: the uptime restarted with the new process.
  await waitFor(async () => (await page.getByTestId('node-header').innerText()).includes(second.url), { what: 'header' });
  assert.equal(await page.evaluate(() => window.__e2eMarker), 'no-reload', 'recovered without a reload');
});
