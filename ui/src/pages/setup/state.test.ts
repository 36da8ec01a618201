import { describe, expect, it } from 'vitest';
import { choiceFromRoles, initialWizard, rolesFromChoice, wizard } from './state';

describe('the setup wizard state', () => {
  it('maps roles to the three choices and back', () => {
    for (const choice of ['both', 'proxy', 'worker'] as const) {
      expect(choiceFromRoles(rolesFromChoice(choice))).toBe(choice);
    }
  });

  it('carries a proxy picked on the network into the connect step, pinned', () => {
    const picked = wizard(initialWizard, { type: 'pickProxy', url: 'https://box:8080', fingerprint: 'sha256:ab' });
    expect(picked.step).toBe(2);
    expect(picked.join).toEqual({ proxyUrl: 'https://box:8080', secret: '', provider: '', fingerprint: 'sha256:ab' });
    const unpinned = wizard(picked, { type: 'pickProxy', url: 'http://other:8080', fingerprint: null });
    expect(unpinned.join.fingerprint).toBe('');
  });

  it('never carries a secret typed for one proxy over to a proxy picked on the network', () => {
    const typed = { ...initialWizard, join: { ...initialWizard.join, proxyUrl: 'http://mine:8080', secret: 's3cret' } };
    const picked = wizard(typed, { type: 'pickProxy', url: 'http://announced:8080', fingerprint: null });
    expect(picked.join.secret).toBe('');
  });

  it('keeps a worker-only choice pending until the worker joins', () => {
    const chosen = wizard(wizard(initialWizard, { type: 'choose', choice: 'worker' }), {
      type: 'rolesChosen',
      pending: true,
    });
    expect(chosen).toMatchObject({ step: 1, choice: 'worker', rolesPending: true });
    const joined = wizard(wizard(chosen, { type: 'joined', url: 'http://box:8080' }), { type: 'rolesSaved' });
    expect(joined).toMatchObject({ joinedUrl: 'http://box:8080', rolesPending: false });
  });

  it('keeps what the person chose and typed when the settings arrive later', () => {
    const typed = wizard(wizard(initialWizard, { type: 'choose', choice: 'worker' }), {
      type: 'edit',
      fields: { proxyUrl: 'http://typed:1' },
    });
    const loaded = wizard(typed, { type: 'loaded', choice: 'both', proxyUrl: 'http://saved:1' });
    expect(loaded.choice).toBe('worker');
    expect(loaded.join.proxyUrl).toBe('http://typed:1');
  });

  it('edits one join field at a time and loads the saved proxy URL', () => {
    const loaded = wizard(initialWizard, { type: 'loaded', choice: 'worker', proxyUrl: 'http://saved:1' });
    const edited = wizard(loaded, { type: 'edit', fields: { secret: 's3' } });
    expect(edited.join).toMatchObject({ proxyUrl: 'http://saved:1', secret: 's3' });
    expect(edited.choice).toBe('worker');
  });
});
