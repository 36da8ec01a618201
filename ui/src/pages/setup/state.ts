// The setup wizard's state: which step, the roles chosen, and the join details that a proxy
// picked in one step carries into the next. One reducer, so every step changes it the same way.
import type { Discovery, Roles } from '../../types';

export const SETUP_DONE_KEY = 'modelrelay.setupDone';

export const STEPS = ['Roles', 'Model servers', 'Connect', 'Clients'] as const;

export type RoleChoice = 'both' | 'proxy' | 'worker';

export function choiceFromRoles(r: Roles): RoleChoice {
  if (r.proxy && !r.worker) return 'proxy';
  if (!r.proxy && r.worker) return 'worker';
  return 'both';
}

export function rolesFromChoice(c: RoleChoice): Roles {
  return { proxy: c !== 'worker', worker: c !== 'proxy' };
}

export function markSetupDone() {
  try {
    localStorage.setItem(SETUP_DONE_KEY, '1');
  } catch {
    /* ignore */
  }
}

/** Where the node's worker joins: typed, pasted as a code, or picked from the network. */
export interface JoinFields {
  proxyUrl: string;
  secret: string;
  provider: string;
  /** The proxy's certificate fingerprint, from a join code or a proxy found on the network. */
  fingerprint: string;
}

export interface WizardState {
  step: number;
  choice: RoleChoice;
  /** The person picked a role already: settings that load later must not undo it. */
  chosen: boolean;
  /** Worker only: the roles are saved when the worker joins, not before (see `rolesChosen`). */
  rolesPending: boolean;
  join: JoinFields;
  joinedUrl: string | null;
  discovery: Discovery | null;
}

export type WizardAction =
  | { type: 'go'; step: number }
  | { type: 'choose'; choice: RoleChoice }
  | { type: 'loaded'; choice: RoleChoice; proxyUrl: string | null }
  | { type: 'rolesChosen'; pending: boolean }
  | { type: 'rolesSaved' }
  | { type: 'edit'; fields: Partial<JoinFields> }
  | { type: 'pickProxy'; url: string; fingerprint: string | null }
  | { type: 'discovered'; discovery: Discovery }
  | { type: 'joined'; url: string };

export const initialWizard: WizardState = {
  step: 0,
  choice: 'both',
  chosen: false,
  rolesPending: false,
  join: { proxyUrl: '', secret: '', provider: '', fingerprint: '' },
  joinedUrl: null,
  discovery: null,
};

export function wizard(state: WizardState, action: WizardAction): WizardState {
  switch (action.type) {
    case 'go':
      return { ...state, step: action.step };
    case 'choose':
      return { ...state, choice: action.choice, chosen: true };
    case 'loaded':
      // The settings may arrive after the first clicks: what the person did wins.
      return {
        ...state,
        choice: state.chosen ? state.choice : action.choice,
        join:
          action.proxyUrl && !state.join.proxyUrl ? { ...state.join, proxyUrl: action.proxyUrl } : state.join,
      };
    case 'rolesChosen':
      return { ...state, rolesPending: action.pending, step: 1 };
    case 'rolesSaved':
      return { ...state, rolesPending: false };
    case 'edit':
      return { ...state, join: { ...state.join, ...action.fields } };
    case 'pickProxy':
      // A proxy announced on the network is anyone's claim: never hand it a secret typed for
      // another one. The person pastes the secret (or a join code) for this one.
      return {
        ...state,
        join: { ...state.join, proxyUrl: action.url, secret: '', fingerprint: action.fingerprint ?? '' },
        step: 2,
      };
    case 'discovered':
      return { ...state, discovery: action.discovery };
    case 'joined':
      return { ...state, joinedUrl: action.url };
  }
}
