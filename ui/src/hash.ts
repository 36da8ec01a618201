import { useEffect, useState } from 'preact/hooks';

export type Route = 'dashboard' | 'keys' | 'usage' | 'setup' | 'settings' | '';

const ROUTES: Route[] = ['dashboard', 'keys', 'usage', 'setup', 'settings'];

export function parseRoute(hash: string): Route {
  const path = hash.replace(/^#\/?/, '').split(/[?/]/)[0];
  return ROUTES.includes(path as Route) && path ? (path as Route) : '';
}

/** The query part of a route's address (#/usage?key=…), without "?": pages keep their filters there. */
export function routeQuery(hash: string): string {
  const at = hash.indexOf('?');
  return at < 0 ? '' : hash.slice(at + 1);
}

export function navigate(route: Exclude<Route, ''>, query = '') {
  const target = `#/${route}${query ? `?${query}` : ''}`;
  if (location.hash !== target) location.hash = target;
}

/**
 * Put a page's state into its address without a new history entry or a hashchange (the page
 * already shows it): reloading or sharing the address shows the same view.
 */
export function replaceRouteQuery(route: Exclude<Route, ''>, query: string) {
  const target = `#/${route}${query ? `?${query}` : ''}`;
  if (location.hash !== target) history.replaceState(history.state, '', target);
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
