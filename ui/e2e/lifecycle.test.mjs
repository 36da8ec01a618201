import assert from 'node:assert/strict';
import { chmodSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { afterEach, test } from 'node:test';
import { cleanup, freePort, launchBrowser, startRelay, tempDir } from './helpers.mjs';

afterEach(cleanup);

// A stand-in for llama-server, started by the worker's model map as a start_script: it serves
// /health and /v1/models on $LLAMA_PORT and exits when its parent (the relay) goes away.
const FAKE_LLAMA = `#!/usr/bin/env node
const http = require('node:http');
const parent = process.ppid;
setInterval(() => { try { process.kill(parent, 0); } catch { process.exit(0); } if (process.ppid !== parent) process.exit(0); }, 500);
http.createServer((req, res) => {
  res.writeHead(200, { 'content-type': 'application/json' });
  if (req.url.startsWith('/health')) return res.end('{"status":"ok"}');
  if (req.url.startsWith('/v1/models')) return res.end('{"object":"list","data":[{"id":"e2e-managed","object":"model"}]}');
  res.end('{}');
}).listen(Number(process.env.LLAMA_PORT), '127.0.0.1');
process.on('SIGTERM', () => process.exit(0));
`;

test('model lifecycle panel loads and unloads a mapped model', { timeout: 120_000 }, async () => {
  const dir = tempDir('mr-fake-llama-');
  const script = path.join(dir, 'fake-llama.cjs');
  writeFileSync(script, FAKE_LLAMA);
  chmodSync(script, 0o755);
  const portBase = await freePort();
  const relay = await startRelay({
    name: 'node',
    env: { MODELRELAY_DISCOVERY_PORTS: String(await freePort()) },
    config: [
      '[worker.lifecycle]',
      `model_port_base = ${portBase}`,
      '[worker.model_map.e2e-managed]',
      `start_script = ${JSON.stringify(script)}`,
      'idle_timeout_secs = 0',
      '',
    ].join('\n'),
  });
  const { page } = await launchBrowser();
  await relay.open(page, '#/dashboard');

  const row = page.locator('[data-testid="lifecycle-row"][data-model="e2e-managed"]');
  await row.waitFor({ timeout: 20_000 });
  assert.equal(await row.getAttribute('data-state'), 'stopped');
  assert.ok(await page.getByRole('button', { name: 'Unload e2e-managed', exact: true }).isDisabled());

  await page.getByRole('button', { name: 'Load e2e-managed', exact: true }).click();
  await page.locator('[data-testid="lifecycle-row"][data-model="e2e-managed"][data-state="ready"]').waitFor({ timeout: 30_000 });
  assert.match(await row.innerText(), /pid \d+/);
  const lifecycle = (await relay.api('/api/lifecycle')).body;
  assert.equal(lifecycle.models.find((m) => m.name === 'e2e-managed')?.state, 'ready');

  await page.getByRole('button', { name: 'Unload e2e-managed', exact: true }).click();
  await page.locator('[data-testid="lifecycle-row"][data-model="e2e-managed"][data-state="stopped"]').waitFor({ timeout: 30_000 });
});
