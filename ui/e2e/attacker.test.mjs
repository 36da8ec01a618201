// A web page the user visits attacks the relay running on their machine, in a real Chromium:
// from another origin (another port), and by DNS rebinding (a host name of the attacker's that
// now resolves to 127.0.0.1, played with --host-resolver-rules). Every attempt must fail, and
// nothing may change: the config file's bytes, the worker, the backend's request count, the
// model refresh, and no program run.
import assert from 'node:assert/strict';
import { existsSync, readFileSync } from 'node:fs';
import http from 'node:http';
import path from 'node:path';
import { afterEach, test } from 'node:test';
import { cleanup, defer, freePort, launchBrowser, startMockBackend, startRelay, status, waitFor } from './helpers.mjs';

afterEach(cleanup);

const USER_CONFIG = '# my settings\n[proxy]\nmax_queue_len = 100\n';

/** An attacker's web server on another port: an empty page the test scripts from. */
async function startAttackerSite() {
  const port = await freePort();
  const server = http.createServer((req, res) => {
    res.writeHead(200, { 'content-type': 'text/html' });
    res.end('<!doctype html><title>cute cats</title><body>cats</body>');
  });
  await new Promise((resolve) => server.listen(port, '127.0.0.1', resolve));
  defer(() => new Promise((resolve) => server.close(resolve)));
  return { url: `http://127.0.0.1:${port}` };
}

/** Runs in the attacker's page: every way a page can reach the relay. Returns what it could read. */
async function attack({ relay, workerId, launch }) {
  const tryRead = async (url, init) => {
    try {
      const res = await fetch(url, init);
      return { status: res.status, type: res.type, text: await res.text() };
    } catch (e) {
      return { error: String(e) };
    }
  };
  const results = {};
  results.joinCode = await tryRead(`${relay}/api/join-code`);
  results.putConfig = await tryRead(`${relay}/api/config`, {
    method: 'PUT',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ toml: launch }),
  });
  results.putConfigPlain = await tryRead(`${relay}/api/config`, {
    method: 'POST',
    mode: 'no-cors',
    headers: { 'content-type': 'text/plain' },
    body: JSON.stringify({ toml: launch }),
  });
  results.refresh = await tryRead(`${relay}/api/models/refresh`, {
    method: 'POST',
    mode: 'no-cors',
    headers: { 'content-type': 'text/plain' },
    body: 'x',
  });
  results.chat = await tryRead(`${relay}/v1/chat/completions`, {
    method: 'POST',
    mode: 'no-cors',
    headers: { 'content-type': 'text/plain' },
    body: JSON.stringify({ model: 'mock-model', messages: [{ role: 'user', content: 'spend the GPU' }] }),
  });
  // Classic form posts, each into a frame of its own.
  for (const action of [`${relay}/api/lifecycle/x/load`, `${relay}/api/workers/${workerId}/drain`]) {
    const frame = document.createElement('iframe');
    frame.name = `f${Math.random()}`;
    document.body.appendChild(frame);
    const form = document.createElement('form');
    form.method = 'POST';
    form.action = action;
    form.target = frame.name;
    form.enctype = 'text/plain';
    const input = document.createElement('input');
    input.name = 'x';
    input.value = 'y';
    form.appendChild(input);
    document.body.appendChild(form);
    form.submit();
  }
  // And the dashboard itself in a frame (clickjacking).
  const dashboard = document.createElement('iframe');
  dashboard.id = 'dashboard-frame';
  dashboard.src = `${relay}/`;
  document.body.appendChild(dashboard);
  await new Promise((resolve) => setTimeout(resolve, 1500));
  return results;
}

test('a web page can neither read nor change the relay, cross-origin or by DNS rebinding', { timeout: 150_000 }, async () => {
  const mock = await startMockBackend({ chunks: 2, chunkDelayMs: 5 });
  const relay = await startRelay({
    name: 'victim',
    config: USER_CONFIG,
    env: { MODELRELAY_DISCOVERY_PORTS: String(mock.port) },
  });
  await waitFor(async () => (await status(relay)).models.some((m) => m.name === 'mock-model'), {
    ms: 30_000,
    what: 'the worker serving the mock model',
  });
  const before = await status(relay);
  const workerId = before.workers[0].id;
  const secret = readFileSync(path.join(relay.dataDir, 'worker-secret'), 'utf8').trim();
  const configBefore = readFileSync(relay.configPath);
  const marker = path.join(relay.dataDir, 'created-by-a-web-page');
  const launch = `[worker.model_map.x]\nstart_script = "/usr/bin/touch"\nargs = [${JSON.stringify(marker)}]\n`;
  const requestsBefore = mock.state.requests;
  const logBefore = relay.log().length;

  const site = await startAttackerSite();
  const { page, context } = await launchBrowser({
    extraArgs: ['--host-resolver-rules=MAP evil.example 127.0.0.1'],
  });

  // The user is signed in to the dashboard in this very browser: the session cookie is there.
  await relay.open(page, '#/dashboard');
  await page.locator('[data-testid="worker-row"]').first().waitFor({ timeout: 20_000 });

  // 1. Another origin: the attacker's page on another port.
  await page.goto(site.url);
  const crossOrigin = await page.evaluate(attack, { relay: relay.url, workerId, launch });
  for (const [name, result] of Object.entries(crossOrigin)) {
    assert.ok(!JSON.stringify(result).includes(secret), `${name} read the secret: ${JSON.stringify(result)}`);
    assert.ok(
      result.error || result.type === 'opaque' || result.status === 403,
      `${name} was readable: ${JSON.stringify(result)}`,
    );
  }
  const framed = page.frames().find((f) => f.url().startsWith(relay.url));
  const framedApp = framed ? await framed.locator('#app').count().catch(() => 0) : 0;
  assert.equal(framedApp, 0, 'the dashboard must not render inside another site');

  // 2. DNS rebinding: the attacker's own name now points at 127.0.0.1, so its page and the relay
  // are "same-origin" to the browser. The relay refuses the name itself.
  const rebound = `http://evil.example:${relay.port}`;
  const landing = await page.goto(`${rebound}/`);
  assert.equal(landing.status(), 403, 'the relay refuses to serve a page under a foreign host name');
  const rebinding = await page.evaluate(attack, { relay: rebound, workerId, launch });
  for (const [name, result] of Object.entries(rebinding)) {
    assert.ok(!JSON.stringify(result).includes(secret), `${name} read the secret: ${JSON.stringify(result)}`);
    assert.ok(
      result.error || result.type === 'opaque' || result.status === 403,
      `${name} succeeded by rebinding: ${JSON.stringify(result)}`,
    );
  }
  await context.close();

  // Nothing changed.
  assert.deepEqual(readFileSync(relay.configPath), configBefore, 'the config file is byte-identical');
  assert.ok(!existsSync(marker), 'the attacker\'s program never ran');
  const after = await status(relay);
  assert.equal(after.workers.length, 1);
  assert.equal(after.workers[0].id, workerId);
  assert.notEqual(after.workers[0].state, 'draining', 'the worker was not drained');
  const requestsAfter = mock.state.requests;
  assert.equal(requestsAfter, requestsBefore, 'no inference request reached the backend');
  const newLog = relay.log().slice(logBefore);
  assert.ok(!/models refresh requested/.test(newLog), `a refresh got through:\n${newLog}`);
  assert.ok(!/settings saved/.test(newLog), `settings were saved:\n${newLog}`);

  // The dashboard itself still works, opened the documented way.
  const { page: own } = await launchBrowser();
  await relay.open(own, '#/dashboard');
  await own.locator('[data-testid="worker-row"]').first().waitFor({ timeout: 20_000 });
});
