import type { Status } from '../types';
import { Card } from './common';

/**
 * Keys and usage live on the proxy: a worker-only node has neither, so its pages point at the
 * proxy it serves instead of failing on a missing route.
 */
export function ProxyOnlyNotice({ status, what, route }: { status: Status; what: string; route: 'keys' | 'usage' }) {
  const proxyUrl = status.node.worker.proxy_url;
  return (
    <Card title="Worker only" testid="proxy-only">
      <p>
        This node runs no proxy, so it has no {what}: they are kept by the proxy that clients call
        {proxyUrl ? (
          <>
            {' '}
            (
            <a href={`${proxyUrl.replace(/\/+$/, '')}/#/${route}`} target="_blank" rel="noreferrer">
              {proxyUrl}
            </a>
            )
          </>
        ) : null}
        .
      </p>
    </Card>
  );
}

/** Whether this node is known to run no proxy (unknown until the first status arrives). */
export function isWorkerOnly(status: Status | null | undefined): status is Status {
  return !!status && !status.node.roles.proxy;
}
