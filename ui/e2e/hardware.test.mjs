import assert from 'node:assert/strict';
import { chmodSync, mkdirSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { afterEach, test } from 'node:test';
import { UI_DIR, cleanup, launchBrowser, startMockBackend, startRelay, status, tempDir, waitFor } from './helpers.mjs';

afterEach(cleanup);

const SECRET = 'e2e-worker-secret';

// The recorded answer of `nvidia-smi --query-gpu=... --format=csv,noheader,nounits` on a box
// with two GPUs (relay-core/tests/fixtures/hardware/nvidia-smi-2gpu.csv).
const FAKE_NVIDIA_SMI = `#!/bin/sh
echo 'NVIDIA GeForce RTX 4090, 18211, 24564, 97, 71'
echo 'NVIDIA RTX A6000, 3, 49140, 0, 34'
`;

test('dashboard shows each worker box: CPU, memory, GPUs, sparklines and model states', { timeout: 120_000 }, async () => {
  const tools = tempDir('mr-fake-smi-');
  writeFileSync(path.join(tools, 'nvidia-smi'), FAKE_NVIDIA_SMI);
  chmodSync(path.join(tools, 'nvidia-smi'), 0o755);
  // A model-map entry that is never started: its state shows as idle.
  const never = path.join(tools, 'never-started.sh');
  writeFileSync(never, '#!/bin/sh\nexit 1\n');
  chmodSync(never, 0o755);

  const mock = await startMockBackend();
  // Heartbeats every second: the worker's report rides on its pongs.
  const relay = await startRelay({ args: ['serve', '--worker-secret', SECRET], name: 'proxy', env: { HEARTBEAT_INTERVAL_SECS: '1' } });
  await startRelay({
    name: 'worker',
    args: ['worker', '--proxy-url', relay.url, '--worker-secret', SECRET, '--backend-url', mock.url, '--worker-name', 'gpu-box'],
    env: { PATH: `${tools}:${process.env.PATH}` },
    config: `[worker.model_map.e2e-mapped]\nstart_script = ${JSON.stringify(never)}\n`,
  });
  await waitFor(async () => (await status(relay)).workers.some((w) => w.name === 'gpu-box' && w.hardware?.gpus?.length === 2), {
    ms: 30_000,
    what: 'the worker to report its GPUs',
  });

  const { page, consoleErrors } = await launchBrowser();
  await page.setViewportSize({ width: 1400, height: 1000 });
  await relay.open(page, '#/dashboard');
  const box = page.locator('[data-testid="worker-hardware-row"][data-worker-name="gpu-box"]');
  await box.waitFor({ timeout: 20_000 });

  const gpus = box.getByTestId('hardware-gpu');
  assert.equal(await gpus.count(), 2);
  assert.equal(await gpus.nth(0).getByTestId('gpu-name').innerText(), 'NVIDIA GeForce RTX 4090');
  assert.equal(await gpus.nth(0).getByTestId('gpu-temperature').innerText(), '71 °C');
  assert.match(await gpus.nth(0).getByTestId('gpu-utilization').innerText(), /97%/);
  assert.match(await gpus.nth(0).getByTestId('gpu-vram').innerText(), /18 GiB \/ 24 GiB/);
  assert.equal(await gpus.nth(0).locator('[role="meter"]').getAttribute('aria-valuenow'), '74');
  assert.equal(await gpus.nth(1).getByTestId('gpu-name').innerText(), 'NVIDIA RTX A6000');
  assert.match(await box.getByTestId('hardware-cpu').innerText(), /CPU\s*\d+%/);
  // The machine's own memory in use: MiB on a quiet machine, GiB on a busy one.
  assert.match(await box.getByTestId('hardware-memory').innerText(), /Memory[\s\S]*[\d.]+ [KMG]iB \/ [\d.]+ GiB/);
  const mapped = box.locator('[data-testid="worker-model-state"][data-model="e2e-mapped"]');
  assert.equal(await mapped.getAttribute('data-state'), 'idle');

  // Sparklines fill in live, one point per heartbeat.
  await waitFor(async () => (await box.locator('[data-testid="hardware-sparkline"][data-label="VRAM"] polyline').count()) >= 1, {
    ms: 15_000,
    what: 'a VRAM sparkline',
  });
  const cpuPoints = async () => {
    const points = await box.locator('[data-label="CPU"] polyline').first().getAttribute('points');
    return (points ?? '').split(' ').length;
  };
  await waitFor(async () => (await cpuPoints()) >= 3, {
    ms: 20_000,
    what: 'three CPU points',
  });
  assert.match(await box.locator('[data-label="VRAM"] figcaption').innerText(), /VRAM 24%/);

  const artifacts = path.resolve(UI_DIR, '../target/artifacts');
  mkdirSync(artifacts, { recursive: true });
  await page.screenshot({ path: path.join(artifacts, 'dashboard-hardware.png'), fullPage: true });
  assert.deepEqual(consoleErrors, []);
});
