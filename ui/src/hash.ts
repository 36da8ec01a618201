import { useEffect, useState } from 'preact/hooks';

export type Route = 'dashboard' | 'setup' | 'settings' | '';

export function parseRoute(hash: string): Route {
  const path = hash.replace(/^#\/?/, '').split(/[?/]/)[0];
  if (path === 'dashboard' || path === 'setup' || path === 'settings') return path;
  return '';
}

export function navigate(route: Exclude<Route, ''>) {
  if (location.hash !== `#/${route}`) location.hash = `#/${route}`;
}

/**
 * The page a path names: the relay also serves the UI at `/dashboard` and `/setup`, the
 * addresses the published runbook links to.
 */
export function routeOfPath(pathname: string): Route {
  return parseRoute(`#${pathname}`);
}

/**
 * The route at load: the hash's, else the path's. A path route moves into the hash (`/setup`
 * becomes `/#/setup`), so navigating between pages keeps working as everywhere else.
 */
function initialRoute(): Route {
  const fromHash = parseRoute(location.hash);
  if (fromHash !== '') return fromHash;
  const fromPath = routeOfPath(location.pathname);
  if (fromPath !== '') history.replaceState(null, '', `/#/${fromPath}`);
  return fromPath;
}

export function useRoute(): Route {
  const [route, setRoute] = useState<Route>(initialRoute);
  useEffect(() => {
    const onChange = () => setRoute(parseRoute(location.hash));
    window.addEventListener('hashchange', onChange);
    return () => window.removeEventListener('hashchange', onChange);
  }, []);
  return route;
}
