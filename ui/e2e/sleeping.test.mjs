// Sleeping boxes: a worker told its box is about to suspend (SIGUSR1) leaves; the dashboard
// shows the box asleep. A request for its model makes the proxy send a Wake-on-LAN packet (to a
// UDP socket standing in for the box's network card): the dashboard shows it waking. The box
// "resumes" (a worker of the same name joins) and the request is answered.

import assert from 'node:assert/strict';
import dgram from 'node:dgram';
import { mkdirSync } from 'node:fs';
import path from 'node:path';
import { afterEach, test } from 'node:test';
import { UI_DIR, chat, cleanup, defer, launchBrowser, startMockBackend, startRelay, status, waitFor } from './helpers.mjs';

afterEach(cleanup);

const SECRET = 'e2e-sleep-secret';
const MAC = '02:1b:2c:3d:4e:5f';
const SCREENSHOT = path.resolve(UI_DIR, '../target/artifacts/dashboard-sleeping.png');

/** A UDP socket on loopback that counts valid magic packets for MAC. */
async function fakeCard() {
  const socket = dgram.createSocket('udp4');
  const mac = Buffer.from(MAC.split(':').map((h) => parseInt(h, 16)));
  const expected = Buffer.concat([Buffer.alloc(6, 0xff), ...Array(16).fill(mac)]);
  const card = { packets: 0, other: 0, port: 0 };
  socket.on('message', (msg) => {
    if (msg.equals(expected)) card.packets += 1;
    else card.other += 1;
  });
  await new Promise((resolve) => socket.bind(0, '127.0.0.1', resolve));
  card.port = socket.address().port;
  defer(() => socket.close());
  return card;
}

const workerArgs = (proxy, mock) => [
  'worker',
  '--proxy-url',
  proxy.url,
  '--worker-secret',
  SECRET,
  '--backend-url',
  mock.url,
  '--worker-name',
  'sleepy-box',
  '--mac-address',
  MAC,
  '--sleeps-when-idle',
];

test('the dashboard shows a sleeping box, then the box waking for a request, then serving it', { timeout: 150_000 }, async () => {
  const card = await fakeCard();
  const mock = await startMockBackend({ chunks: 3, chunkDelayMs: 20 });
  const proxy = await startRelay({
    args: ['serve', '--worker-secret', SECRET, '--wake-target', `127.0.0.1:${card.port}`, '--queue-timeout', '90'],
    name: 'proxy',
  });
  const box = await startRelay({ args: workerArgs(proxy, mock), name: 'box' });
  await waitFor(async () => (await status(proxy)).workers.some((w) => w.name === 'sleepy-box'), {
    ms: 20_000,
    what: 'the box to join',
  });

  const { page, consoleErrors } = await launchBrowser();
  await proxy.open(page);
  await page.goto(`${proxy.url}/dashboard`);
  await page.getByTestId('worker-row').first().waitFor();

  // The box is about to suspend: a systemd-sleep hook sends its worker SIGUSR1.
  process.kill(box.child.pid, 'SIGUSR1');
  const row = page.locator('[data-testid="sleeper-row"][data-sleeper-name="sleepy-box"]');
  await row.waitFor({ timeout: 20_000 });
  assert.equal(await row.getAttribute('data-state'), 'asleep');
  assert.equal(await row.getByTestId('sleeper-state').innerText(), 'asleep');
  assert.match(await row.getByTestId('sleeper-models').innerText(), /mock-model/);
  await page.getByTestId('no-workers').waitFor();
  assert.match(
    await page.locator('[data-testid="model-row"][data-model="mock-model"]').innerText(),
    /asleep: sleepy-box/,
  );
  // Suspended for real: the process is frozen by the kernel; here it is gone.
  await box.stop();

  const answer = chat(proxy.url, { stream: false, timeoutMs: 120_000 });
  await waitFor(() => card.packets >= 1, { ms: 20_000, what: 'the magic packet' });
  await waitFor(async () => (await row.getAttribute('data-state')) === 'waking', { what: 'the box to show waking' });
  assert.equal(await row.getByTestId('sleeper-state').innerText(), 'waking (1 packet)');
  assert.equal(await row.getByTestId('sleeper-cause').innerText(), 'a request for a model no awake box serves');
  assert.notEqual(await row.getByTestId('sleeper-waking').innerText(), '—');
  mkdirSync(path.dirname(SCREENSHOT), { recursive: true });
  await page.screenshot({ path: SCREENSHOT, fullPage: true });

  // The box resumes: its worker reconnects and the waiting request is answered.
  await startRelay({ args: workerArgs(proxy, mock), name: 'box-resumed' });
  const { status: code, text } = await answer;
  assert.equal(code, 200, text);
  await waitFor(async () => (await row.count()) === 0, { what: 'the sleeping box to leave the list' });
  await page.locator('[data-testid="worker-row"][data-worker-name="sleepy-box"]').waitFor();
  assert.equal(card.packets, 1, 'one packet for one request');
  assert.equal(card.other, 0);
  assert.deepEqual(consoleErrors, []);
});
