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

export function useRoute(): Route {
  const [route, setRoute] = useState<Route>(() => parseRoute(location.hash));
  useEffect(() => {
    const onChange = () => setRoute(parseRoute(location.hash));
    window.addEventListener('hashchange', onChange);
    return () => window.removeEventListener('hashchange', onChange);
  }, []);
  return route;
}
