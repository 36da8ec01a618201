// The live status feed: one EventSource on /api/events, shared by every page.

import { createContext } from 'preact';
import { useContext, useEffect, useState } from 'preact/hooks';
import { eventsUrl, probeUnauthorized } from './api';
import type { Status } from './types';

export type Connection = 'connecting' | 'live' | 'reconnecting' | 'unauthorized';

export interface Live {
  status: Status | null;
  connection: Connection;
  /** Viewer clock (ms) at the last event: used for "connected since" columns. */
  receivedAt: number;
}

export const LiveContext = createContext<Live>({ status: null, connection: 'connecting', receivedAt: 0 });

export function useLive(): Live {
  return useContext(LiveContext);
}

/** The feed sends at least once a second; this long without an event means it is stuck. */
const STALL_MS = 6000;

export function useLiveStatus(enabled: boolean, epoch: number): Live {
  const [live, setLive] = useState<Live>({ status: null, connection: 'connecting', receivedAt: 0 });

  useEffect(() => {
    if (!enabled) return;
    let es: EventSource | null = null;
    let stopped = false;
    let retryTimer: ReturnType<typeof setTimeout> | undefined;
    let lastEvent = Date.now();
    let failures = 0;

    const markReconnecting = () =>
      setLive((prev) => (prev.connection === 'reconnecting' ? prev : { ...prev, connection: 'reconnecting' }));

    const open = () => {
      if (stopped) return;
      es?.close();
      lastEvent = Date.now();
      const source = new EventSource(eventsUrl());
      es = source;
      source.addEventListener('status', (ev) => {
        lastEvent = Date.now();
        failures = 0;
        try {
          const status = JSON.parse((ev as MessageEvent<string>).data) as Status;
          setLive({ status, connection: 'live', receivedAt: Date.now() });
        } catch {
          /* a malformed event: keep the last good one */
        }
      });
      source.onerror = async () => {
        if (stopped || es !== source) return;
        markReconnecting();
        // A non-200 answer (401, 404) closes the EventSource for good; network errors retry by
        // themselves. Find out which, and reopen ourselves when the browser gave up.
        if (source.readyState === EventSource.CLOSED) {
          if (await probeUnauthorized()) {
            setLive((prev) => ({ ...prev, connection: 'unauthorized' }));
            return;
          }
          scheduleReopen();
        }
      };
    };

    const scheduleReopen = () => {
      if (stopped) return;
      clearTimeout(retryTimer);
      failures += 1;
      const delay = Math.min(5000, 500 * 2 ** Math.min(failures, 4));
      retryTimer = setTimeout(open, delay);
    };

    const watchdog = setInterval(() => {
      if (!stopped && Date.now() - lastEvent > STALL_MS) {
        markReconnecting();
        es?.close();
        lastEvent = Date.now();
        scheduleReopen();
      }
    }, 1000);

    open();
    return () => {
      stopped = true;
      clearInterval(watchdog);
      clearTimeout(retryTimer);
      es?.close();
    };
  }, [enabled, epoch]);

  return live;
}
