// Whether inference needs a key right now, and how to change that (a start option, not a
// setting the UI can flip: turning it on locks out every client without a key).
import { Alert } from '../../components/common';

export function RequireKeysNotice({ required, activeKeys }: { required: boolean | null; activeKeys: number }) {
  if (required === true) {
    return (
      // Required with no active key is a relay that refuses everyone: a warning, not good news.
      <Alert kind={activeKeys === 0 ? 'warning' : 'success'} testid="keys-required">
        <strong>API keys are required.</strong> Inference requests without a valid key are refused with 401; each key's
        requests are counted on the <a href="#/usage?group_by=key">Usage</a> page. Creating or revoking a key then asks
        for the admin token, even on this machine.
        {activeKeys === 0 ? (
          <>
            {' '}
            <strong>No key is active yet, so every client is refused:</strong> create one below.
          </>
        ) : null}
      </Alert>
    );
  }
  return (
    <Alert kind="info" testid="keys-not-required">
      {required === false ? (
        <>
          <strong>API keys are not required now:</strong> anyone who can reach this relay can use its models. Requests that
          send a key are still checked against its limits and counted per key.
        </>
      ) : (
        <>This relay does not say whether it requires API keys.</>
      )}{' '}
      To require a key for every inference request, start the relay with <code>--require-api-keys</code>, set{' '}
      <code>MODELRELAY_REQUIRE_API_KEYS=true</code>, or put <code>require_api_keys = true</code> under{' '}
      <code>[proxy]</code> in the config file and restart.
    </Alert>
  );
}
