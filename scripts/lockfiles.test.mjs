// Supply chain: every package an npm lockfile of this repository installs carries the
// registry's integrity hash, so `npm ci` on any OS (the release builds run on macOS and Windows
// too) checks what it downloads. An entry without one is installed unchecked.
// Run by scripts/test.sh: `node --test scripts/lockfiles.test.mjs`.
import assert from 'node:assert/strict';
import { readdirSync, readFileSync } from 'node:fs';
import path from 'node:path';
import { test } from 'node:test';
import { fileURLToPath } from 'node:url';

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');

/** Every package-lock.json of the repository, outside node_modules and build output. */
function lockfiles(dir = root) {
  const found = [];
  for (const entry of readdirSync(dir, { withFileTypes: true })) {
    if (['node_modules', 'target', '.git', '.venv'].includes(entry.name)) continue;
    const full = path.join(dir, entry.name);
    if (entry.isDirectory()) found.push(...lockfiles(full));
    else if (entry.name === 'package-lock.json') found.push(full);
  }
  return found;
}

/** The entries of a lockfile that are installed from a registry but carry no integrity. */
export function entriesWithoutIntegrity(lock) {
  return Object.entries(lock.packages ?? {})
    .filter(([key, entry]) => key !== '' && !entry.link)
    .filter(([, entry]) => typeof entry.integrity !== 'string' || !/^sha(256|384|512)-/.test(entry.integrity))
    .map(([key]) => key);
}

test('the repository has the lockfiles this test is about', () => {
  const names = lockfiles().map((f) => path.relative(root, f)).sort();
  assert.deepEqual(names, ['src-tauri/package-lock.json', 'ui/package-lock.json']);
});

for (const file of lockfiles()) {
  test(`every entry of ${path.relative(root, file)} carries its registry integrity`, () => {
    const lock = JSON.parse(readFileSync(file, 'utf8'));
    assert.ok(lock.lockfileVersion >= 2, 'lockfile v2+ (with a packages map)');
    assert.deepEqual(entriesWithoutIntegrity(lock), [], 'regenerate with npm so every entry gets one');
  });
}

test('an entry without integrity is caught', () => {
  const lock = {
    packages: {
      '': { name: 'x' },
      'node_modules/a': { version: '1.0.0', integrity: 'sha512-abc' },
      'node_modules/b': { version: '1.0.0', resolved: 'https://registry.example/b.tgz' },
      'node_modules/c': { link: true, resolved: '../c' },
      'node_modules/d': { version: '1.0.0', integrity: 'md5-abc' },
    },
  };
  assert.deepEqual(entriesWithoutIntegrity(lock), ['node_modules/b', 'node_modules/d']);
});
