import { describe, expect, it } from 'vitest';
import { sampleStatus } from './fixtures';
import {
  clockFor,
  tokensLabel,
  MAX_IN_FLIGHT_ROWS,
  rolesLabel,
  seriesData,
  toDashboardView,
  toLifecycleRows,
  toSleeperRows,
  toStorageNotice,
  speedLabel,
  weighedLabel,
  placementsLabel,
} from './viewmodel';

const NOW = 1_763_740_065_000; // 65 s after the workers connected

describe('toDashboardView', () => {
  const view = toDashboardView(sampleStatus(), NOW);

  it('describes the node', () => {
    expect(view.node.url).toBe('http://127.0.0.1:8080');
    expect(view.node.roles).toEqual(['proxy', 'worker']);
    expect(view.node.rolesLabel).toBe('proxy + worker');
    expect(view.node.uptime).toBe('2m 05s');
    expect(view.node.ownWorker).toMatchObject({ state: 'connected', label: 'connected', tone: 'ok' });
  });

  it('sorts workers by name and formats their columns', () => {
    expect(view.workers.map((w) => w.name)).toEqual(['gpu-box', 'zeta']);
    const w = view.workers[0];
    expect(w).toMatchObject({
      id: 'w-1',
      loadLabel: '1 / 4',
      loadFraction: 0.25,
      state: 'busy',
      tone: 'busy',
      connectedSince: '1m 05s',
      heartbeat: '0.80 ms',
      canDrain: true,
      modelsLabel: 'qwen2.5-7b',
    });
    expect(view.workers[1].heartbeat).toBe('—');
    expect(view.workers[1].tone).toBe('ok');
  });

  it('does not offer to drain a draining worker', () => {
    const s = sampleStatus();
    s.workers[0].state = 'draining';
    const v = toDashboardView(s, NOW);
    const zeta = v.workers.find((w) => w.id === 'w-2')!;
    expect(zeta.canDrain).toBe(false);
    expect(zeta.tone).toBe('warn');
  });

  it('names the workers serving each model', () => {
    expect(view.models.map((m) => [m.name, m.workersLabel])).toEqual([
      ['gone', 'no worker (queueing)'],
      ['llama3', 'zeta'],
      ['qwen2.5-7b', 'gpu-box'],
    ]);
    expect(view.servedModels).toEqual(['llama3', 'qwen2.5-7b']);
  });

  it('lists in-flight requests oldest first, with worker names', () => {
    expect(view.inFlight.map((r) => r.id)).toEqual(['r-18', 'r-17']);
    expect(view.inFlight[1]).toMatchObject({
      worker: 'gpu-box',
      age: '1.2 s',
      ttft: '45 ms',
      tokens: '120',
      tokensPerSec: '97.2 tok/s',
      state: 'running',
    });
    expect(view.inFlight[0]).toMatchObject({ worker: 'queued', ttft: '—', tokensPerSec: '—' });
  });

  it('says when a waiting request asked for a name no worker serves', () => {
    const status = sampleStatus();
    status.in_flight[1] = { ...status.in_flight[1], model: 'claude-opus-5-5' };
    const waiting = toDashboardView(status, NOW).inFlight.find((r) => r.id === 'r-18');
    expect(waiting).toMatchObject({ model: 'claude-opus-5-5', worker: 'no worker serves this name yet', state: 'queued' });
  });

  it('sums queues and formats totals', () => {
    expect(view.queueDepthTotal).toBe(2);
    expect(view.totals).toEqual({ requests: '10', errors: '1', tokens: '1,234', errorRate: '10%' });
    const empty = toDashboardView(sampleStatus({ totals: { requests: 0, errors: 0, tokens: 0 } }), NOW);
    expect(empty.totals.errorRate).toBe('—');
  });

  it('shows an unknown worker id as is', () => {
    const s = sampleStatus();
    s.in_flight[0].worker = 'w-404';
    expect(toDashboardView(s, NOW).inFlight.find((r) => r.id === 'r-17')!.worker).toBe('w-404');
  });

  it('labels every role combination', () => {
    expect(rolesLabel({ proxy: true, worker: false })).toBe('proxy');
    expect(rolesLabel({ proxy: false, worker: true })).toBe('worker');
    expect(rolesLabel({ proxy: false, worker: false })).toBe('no role');
    const off = sampleStatus();
    off.node.worker = { state: 'off', proxy_url: null, name: null, last_error: null };
    expect(toDashboardView(off, NOW).node.ownWorker).toMatchObject({ label: 'off', tone: 'muted' });
  });

  it('labels a worker its proxy drained, with the reason', () => {
    const drained = sampleStatus();
    drained.node.worker = {
      state: 'drained',
      proxy_url: 'http://10.0.0.2:8080',
      name: 'gpu-box',
      last_error: 'drained by the proxy: proxy shutting down',
    };
    expect(toDashboardView(drained, NOW).node.ownWorker).toMatchObject({
      state: 'drained',
      label: 'drained by the proxy',
      tone: 'warn',
      lastError: 'drained by the proxy: proxy shutting down',
    });
  });
});

describe('toSleeperRows', () => {
  it('lists waking boxes first, with how long they slept and since the first packet', () => {
    const now = 1_000_000_000;
    const rows = toSleeperRows(
      {
        sleepers: [
          { name: 'b-asleep', provider: 'local', models: ['m1'], mac_address: null, since_unix_ms: now - 3_600_000, state: 'asleep', waking_since_unix_ms: null, wake_packets: 0, wake_cause: null },
          { name: 'a-waking', provider: 'gpu', models: ['m2'], mac_address: '02:00:00:00:00:01', since_unix_ms: now - 60_000, state: 'waking', waking_since_unix_ms: now - 5_000, wake_packets: 2, wake_cause: 'queue_waited' },
        ],
      },
      now,
    );
    expect(rows.map((r) => r.name)).toEqual(['a-waking', 'b-asleep']);
    expect(rows[0].stateLabel).toBe('waking (2 packets)');
    expect(rows[0].tone).toBe('warn');
    expect(rows[0].wakingFor).not.toBe(rows[1].wakingFor);
    expect(rows[0].wakeCause).toBe('requests have waited, together, as long as the wake takes');
    expect(rows[1].stateLabel).toBe('asleep');
    expect(rows[1].wakeCause).toBeNull();
    expect(rows[1].mac).toMatch(/cannot be woken/);
  });

  it('is empty for relays that do not report sleepers', () => {
    expect(toSleeperRows({}, 0)).toEqual([]);
  });
});

describe('seriesData', () => {
  it('pairs timestamps with values, trimmed to the shorter array', () => {
    const s = sampleStatus();
    expect(seriesData(s, 'requests_per_sec')).toEqual([[1_763_740_000, 1_763_740_001, 1_763_740_002], [0, 2, 1]]);
    expect(seriesData(s, 'queue_depth')).toEqual([[1_763_740_001, 1_763_740_002], [0, 1]]);
  });
});

describe('toLifecycleRows', () => {
  it('offers Load for stopped models and Unload for running ones', () => {
    const rows = toLifecycleRows(
      [
        { name: 'b', state: 'ready', port: 9001, pid: 42, last_used_unix_ms: NOW - 30_000, restarts: 1, crashes: 0, in_flight: 1, last_error: null, retry_in_secs: null, last_load_ms: 2_400 },
        { name: 'a', state: 'stopped', port: null, pid: null, last_used_unix_ms: null, restarts: 0, crashes: 0, in_flight: 0, last_error: null, retry_in_secs: null, last_load_ms: null },
        { name: 'c', state: 'failed', port: null, pid: null, last_used_unix_ms: null, restarts: 0, crashes: 3, in_flight: 0, last_error: 'exit 1', retry_in_secs: 20, last_load_ms: null },
      ],
      NOW,
    );
    expect(rows.map((r) => [r.name, r.tone, r.canLoad, r.canUnload])).toEqual([
      ['a', 'muted', true, false],
      ['b', 'ok', false, true],
      ['c', 'bad', true, true],
    ]);
    expect(rows[1].detail).toBe('port 9001 · pid 42 · loads in 2.4 s');
    expect(rows[1].lastUsed).toBe('30 s ago');
    expect(rows[0].lastUsed).toBe('never');
    expect(rows[2].detail).toBe('retry in 20 s');
  });
});

describe('clockFor', () => {
  const s = sampleStatus(); // last series point: 1_763_740_002 s
  it("uses the browser's clock when it agrees with the relay's", () => {
    expect(clockFor(s, 1_763_740_003_000)).toBe(1_763_740_003_000);
  });
  it("uses the relay's clock when the browser's is off", () => {
    expect(clockFor(s, 1_763_740_600_000)).toBe(1_763_740_002_500);
    expect(clockFor(s, 1_000)).toBe(1_763_740_002_500);
  });
  it('falls back to the browser without series', () => {
    expect(clockFor({ series: { ...s.series, unix_secs: [] } }, 42)).toBe(42);
  });
});

describe('many requests in flight', () => {
  it('lists only the oldest ones but counts all', () => {
    const s = sampleStatus();
    const base = s.in_flight[0];
    s.in_flight = Array.from({ length: MAX_IN_FLIGHT_ROWS + 50 }, (_, i) => ({ ...base, id: `r-${i}`, age_ms: i }));
    const v = toDashboardView(s, NOW);
    expect(v.inFlight.length).toBe(MAX_IN_FLIGHT_ROWS);
    expect(v.inFlightTotal).toBe(MAX_IN_FLIGHT_ROWS + 50);
    expect(v.inFlight[0].id).toBe(`r-${MAX_IN_FLIGHT_ROWS + 49}`);
  });
});

describe('context windows', () => {
  it('are said the way people say them', () => {
    expect(tokensLabel(4096)).toBe('4k');
    expect(tokensLabel(131072)).toBe('128k');
    expect(tokensLabel(1536)).toBe('1.5k');
    expect(tokensLabel(512)).toBe('512');
  });
});

describe('toStorageNotice', () => {
  const healthy = { writable: true, problem: null, since_unix_ms: null, usage_records_not_stored: 0, writes_failed: 0 };
  it('says nothing while the database takes writes, or when the relay does not report it', () => {
    expect(toStorageNotice({ storage: healthy }, 0)).toBeNull();
    expect(toStorageNotice({}, 0)).toBeNull();
  });

  it('says what is wrong, since when and how much usage was not stored', () => {
    const now = 1_000_000_000;
    const notice = toStorageNotice(
      {
        storage: {
          writable: false,
          problem: "the disk holding the proxy's database is full: free some space there",
          since_unix_ms: now - 90_000,
          usage_records_not_stored: 12,
          writes_failed: 3,
        },
      },
      now,
    );
    expect(notice?.problem).toMatch(/disk .* is full/);
    expect(notice?.since).not.toBe('since start');
    expect(notice?.notStored).toBe('Usage of 12 finished requests could not be stored.');
  });

  it('reads a store opened read-only at start as failing since start', () => {
    const notice = toStorageNotice(
      { storage: { ...healthy, writable: false, problem: 'read-only', usage_records_not_stored: 1 } },
      0,
    );
    expect(notice?.since).toBe('since start');
    expect(notice?.notStored).toBe('Usage of 1 finished request could not be stored.');
  });
});

describe('routing: measured speeds and why a request went where it runs', () => {
  it('shows each worker its measured speeds per model, and each running request its reason', () => {
    const view = toDashboardView(sampleStatus(), 1_763_740_010_000);
    const gpu = view.workers.find((w) => w.name === 'gpu-box');
    expect(gpu?.speeds['qwen2.5-7b']).toBe('prompt 2,048 tok/s · generation 45.3 tok/s');
    expect(view.workers.find((w) => w.name !== 'gpu-box')?.speeds).toEqual({});
    const [running, queued] = [view.inFlight.find((r) => r.state === 'running'), view.inFlight.find((r) => r.state === 'queued')];
    expect(running?.reason).toBe('cache hit (its conversation is there)');
    expect(queued?.reason).toBe('');
  });

  it('shows what cost routing weighed, where it moved a request and where it kept it', () => {
    const status = sampleStatus();
    status.in_flight[0] = {
      ...status.in_flight[0],
      reason: 'faster_box',
      weighed: { kept: false, first_token_s: 1.04, other: 'box-a', other_s: 21.3, answer_s: -8.2, eviction_s: 0 },
    };
    const rows = toDashboardView(status, 1_763_740_010_000).inFlight;
    const [moved, queued] = [rows.find((r) => r.id === 'r-17')!, rows.find((r) => r.id === 'r-18')!];
    expect(moved.reason).toBe('faster box (measured)');
    expect(moved.weighed).toBe('first token ≈ 1.0 s here, ≈ 21 s on box-a · answer ≈ 8.2 s sooner here');
    expect(queued.weighed).toBe('');
    expect(
      weighedLabel({ kept: false, first_token_s: 12.4, other: null, other_s: 30, answer_s: 0, eviction_s: 3.25 }),
    ).toBe('first token ≈ 12 s here, ≈ 30 s waiting for a slot · ≈ 3.3 s for the conversation it evicts');
    // Kept where it is sooner anyway: no second line.
    expect(
      weighedLabel({ kept: true, first_token_s: 0.2, other: 'slow-box', other_s: 4.1, answer_s: -3, eviction_s: 0 }),
    ).toBe('');
    // Kept on a slow box: the faster one weighed, and why it lost.
    expect(
      weighedLabel({ kept: true, first_token_s: 20.5, other: 'fast-box', other_s: 12.35, answer_s: 0, eviction_s: 0 }),
    ).toBe('first token ≈ 21 s here; ≈ 12 s on fast-box, not clearly sooner');
    expect(
      weighedLabel({ kept: true, first_token_s: 0.5, other: 'fast-box', other_s: 0.2, answer_s: 1.5, eviction_s: 4 }),
    ).toBe(
      'first token ≈ 0.5 s here; ≈ 0.2 s on fast-box, not clearly sooner · answer ≈ 1.5 s later here · ≈ 4.0 s on fast-box for the conversation it would evict',
    );
  });

  it('counts placements since start by reason, and says whether cost routing is on', () => {
    const status = sampleStatus();
    expect(toDashboardView(status, 1_763_740_010_000).placements).toBe('');
    status.placements = {
      cost_routing: true,
      by_reason: [
        { reason: 'cache_hit', count: 1360 },
        { reason: 'home_busy', count: 0 },
        { reason: 'faster_box', count: 45 },
        { reason: 'side_request', count: 143 },
      ],
    };
    expect(toDashboardView(status, 1_763_740_010_000).placements).toBe(
      'cache hit 1,360 · faster box 45 · side request 143 · cost routing on',
    );
    expect(placementsLabel({ cost_routing: false, by_reason: [{ reason: 'least_loaded', count: 2 }] })).toBe(
      'least loaded 2 · cost routing off',
    );
  });

  it('says only what was measured', () => {
    expect(speedLabel(null, null)).toBe('');
    expect(speedLabel(950, null)).toBe('prompt 950 tok/s');
    expect(speedLabel(null, 12)).toBe('generation 12 tok/s');
  });
});
