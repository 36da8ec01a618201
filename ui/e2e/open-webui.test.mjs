// Open WebUI, for real (issue "Nothing but the URL"): the PyPI release, offline, pointed at the
// relay and nothing else, used in Chromium as a person uses it — the model is listed, a streamed
// chat, a second turn, the title, tags and follow-up tasks, and Stop, which the relay turns into
// a cancel at the backend. Open WebUI never asks for usage in its streams; every request's
// tokens must still reach the Usage page and /metrics.
//
// Open WebUI's environment is about 7 GB (torch among its dependencies), so it is cached outside
// the checkout (scripts/real-clients.sh, which CI runs); without it this test is skipped and
// says why.
import assert from 'node:assert/strict';
import path from 'node:path';
import { afterEach, test } from 'node:test';
import { ARTIFACTS, cleanup, launchBrowser, startMockBackend, startRelay, status, waitFor } from './helpers.mjs';
import { openWebUiMissing, startOpenWebUI } from './open-webui.mjs';

afterEach(cleanup);

const SECRET = 'e2e-open-webui-worker-secret';
const MODEL = 'qwen2.5-7b-instruct';

/** What the mock answers Open WebUI's background tasks with, in the JSON they ask for. */
function taskReply(body) {
  const prompt = JSON.stringify(body.messages ?? []);
  if (prompt.includes('Generate a concise')) return JSON.stringify({ title: 'Relays at home' });
  if (prompt.includes('tags categorizing')) return JSON.stringify({ tags: ['Networking'] });
  if (prompt.includes('Predict 3-5 useful')) return JSON.stringify({ follow_ups: ['How fast is the relay?'] });
  return null;
}

/** The words of a number as the dashboard prints it ("1,234" → 1234). */
const count = (text) => Number(text.replace(/[^0-9]/g, ''));

/** Sum of one metric's samples in Prometheus text. */
function metricSum(text, name) {
  let sum = 0;
  for (const line of text.split('\n')) {
    if (line.startsWith(`${name}{`) || line.startsWith(`${name} `)) sum += Number(line.split(' ').pop());
  }
  return sum;
}

const missing = openWebUiMissing();

test('Open WebUI lists the model, streams chats with tasks, stops at the backend, and every token is counted', { skip: missing ?? false, timeout: 240_000 }, async () => {
  const mock = await startMockBackend({ model: MODEL, chunks: 12, chunkDelayMs: 20, usageWhenAsked: true, reply: taskReply });
  const relay = await startRelay({ args: ['serve', '--worker-secret', SECRET], name: 'proxy' });
  await startRelay({
    name: 'worker',
    args: ['worker', '--proxy-url', relay.url, '--worker-secret', SECRET, '--backend-url', mock.url],
  });
  await waitFor(async () => (await status(relay)).models.some((m) => m.name === MODEL), { ms: 20_000, what: 'the worker to serve the model' });
  const webui = await startOpenWebUI({ relayUrl: relay.url, defaultModel: MODEL });

  const { page } = await launchBrowser();
  await page.goto(webui.url);
  await page.getByRole('button', { name: "Okay, Let's Go!" }).click();

  // The relay's model is listed (Open WebUI read the relay's /v1/models) and selected.
  const models = await page.evaluate(async () => {
    const res = await fetch('/api/models', { headers: { authorization: `Bearer ${localStorage.token}` } });
    return (await res.json()).data.map((m) => m.id);
  });
  assert.deepEqual(models, [MODEL]);
  await page.getByText(MODEL, { exact: true }).first().waitFor();

  // A streamed chat, then its background tasks: the title and the follow-up suggestions show.
  const input = page.locator('#chat-input');
  await input.click();
  await page.keyboard.type('Tell me about relays');
  await page.keyboard.press('Enter');
  const answer = 'tok '.repeat(12).trim();
  await page.getByText(answer, { exact: true }).first().waitFor({ timeout: 30_000 });
  await page.getByText('Relays at home').first().waitFor({ timeout: 30_000 });
  await page.getByText('How fast is the relay?').first().waitFor({ timeout: 30_000 });
  const tags = await page.evaluate(async () => {
    const res = await fetch('/api/v1/chats/all/tags', { headers: { authorization: `Bearer ${localStorage.token}` } });
    return (await res.json()).map((t) => t.name ?? t.id);
  });
  assert.ok(tags.some((t) => /networking/i.test(t)), `tags stored: ${JSON.stringify(tags)}`);

  // A second turn carries the first (the streamed request holds three messages).
  await input.click();
  await page.keyboard.type('And the second turn');
  await page.keyboard.press('Enter');
  await waitFor(() => mock.state.seen.some((s) => s.body.stream && s.body.messages.length === 3), { ms: 30_000, what: 'the second turn at the backend' });
  await waitFor(async () => (await page.getByText(answer, { exact: true }).count()) === 2, { ms: 30_000, what: 'the second answer shown' });

  // Every request answered so far is counted, though Open WebUI asked for no usage in its
  // streams: the worker asked the backend and kept the extra event out of the client's stream.
  // Open WebUI's tasks after the second turn: wait until the backend has been quiet for 3 s.
  let quietSince = { length: -1, at: 0 };
  await waitFor(
    () => {
      if (mock.state.seen.length !== quietSince.length) quietSince = { length: mock.state.seen.length, at: Date.now() };
      return Date.now() - quietSince.at > 3_000;
    },
    { ms: 40_000, what: 'the second turn\'s tasks to end' },
  );
  const streamed = mock.state.seen.filter((s) => s.body.stream);
  assert.ok(streamed.every((s) => s.body.stream_options?.include_usage === true), 'the backend was asked for usage');
  const words = (messages) =>
    messages.reduce((n, m) => n + (typeof m.content === 'string' ? m.content : m.content.map((p) => p.text ?? '').join(' ')).split(/\s+/).filter(Boolean).length, 0);
  let expectedInput = 0;
  await waitFor(
    async () => {
      expectedInput = mock.state.seen.reduce((n, s) => n + words(s.body.messages), 0);
      const usage = (await relay.api('/api/usage')).body;
      return usage.totals.requests === mock.state.seen.length && usage.totals.input_tokens === expectedInput;
    },
    { ms: 20_000, what: 'the usage records to hold every request and its prompt tokens' },
  );
  const metrics = await relay.api('/metrics');
  assert.equal(metricSum(metrics.body, 'modelrelay_input_tokens_total'), expectedInput, 'input tokens in /metrics');
  const usagePage = await page.context().newPage();
  await relay.open(usagePage, '#/usage');
  await usagePage.getByTestId('usage-total-input').waitFor();
  await waitFor(async () => count(await usagePage.getByTestId('usage-total-input').innerText()) === expectedInput, {
    what: `the Usage page to show ${expectedInput} input tokens`,
  });
  await usagePage.close();

  // Stop: a long answer is stopped in the browser; the relay cancels it at the backend.
  mock.state.chunks = 2_000;
  mock.state.chunkDelayMs = 20;
  const before = mock.state.seen.length;
  await input.click();
  await page.keyboard.type('Now a long one');
  await page.keyboard.press('Enter');
  await waitFor(() => mock.state.seen.slice(before).some((s) => s.body.stream), { ms: 30_000, what: 'the long answer to start' });
  const long = mock.state.seen.slice(before).find((s) => s.body.stream);
  const stop = page.getByRole('button', { name: 'Stop' });
  await stop.waitFor();
  const stoppedAt = Date.now();
  await stop.click();
  await waitFor(() => long.closedEarlyAt !== null, { ms: 10_000, what: 'the backend request to be cancelled' });
  const cancelMs = long.closedEarlyAt - stoppedAt;
  console.log(`Stop in Open WebUI to the backend's request closing: ${cancelMs} ms`);
  assert.ok(cancelMs < 1_000, `cancelled at the backend ${cancelMs} ms after Stop`);
  await page.screenshot({ path: path.join(ARTIFACTS, 'open-webui.png'), fullPage: true });
});
