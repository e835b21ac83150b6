// A real OpenID provider for the identity tests: npm `oidc-provider@9` (a certified
// implementation), installed by scripts/bootstrap-servers into .deps/npm.
//
//   node provider.mjs   -> prints "ISSUER <url>" and "OTHER <url>" on stdout, then serves
//
// Two issuers share one signing key: a token of OTHER carries a valid signature but the
// wrong `iss`. Accounts: any name signs in through the devInteractions form; GROUPS below
// gives some names groups (an `groups` claim in ID and access tokens). Clients:
// `sidecar-console` (authorization code + PKCE, the console's loopback callback) and one
// client_credentials client per name in GROUPS (`sub` = the client id), plus `shortlived`
// whose tokens expire after 2 s. Access tokens are JWTs for the requested resource
// (default `urn:sidecar`).
import { createRequire } from 'node:module';
import { generateKeyPairSync } from 'node:crypto';

const require = createRequire(process.env.NPM_MODULES + '/');
const { default: Provider } = await import(require.resolve('oidc-provider'));

const GROUPS = { alice: ['engineering'], bob: ['engineering'], olga: ['ops'], mallory: [], root: [],
                 shortlived: ['engineering'] };
const { privateKey } = generateKeyPairSync('rsa', { modulusLength: 2048 });
const jwk = { ...privateKey.export({ format: 'jwk' }), kid: 'test-key', use: 'sig', alg: 'RS256' };

function configuration() {
  return {
    jwks: { keys: [jwk] },
    clients: [
      // a native client: a loopback redirect URI matches on any port (RFC 8252 7.3)
      { client_id: 'sidecar-console', client_secret: 'console-secret',
        application_type: 'native', redirect_uris: ['http://127.0.0.1/ui/login/callback'],
        grant_types: ['authorization_code'],
        response_types: ['code'], token_endpoint_auth_method: 'client_secret_post' },
      ...Object.keys(GROUPS).map((name) => ({
        client_id: name, client_secret: `${name}-secret`, grant_types: ['client_credentials'],
        redirect_uris: [], response_types: [] })),
    ],
    async findAccount(ctx, id) {
      return { accountId: id,
               async claims() { return { sub: id, groups: GROUPS[id] || [] }; } };
    },
    claims: { openid: ['sub', 'groups'] },
    extraTokenClaims(ctx, token) {
      const who = token.accountId || token.clientId;
      return { groups: GROUPS[who] || [] };
    },
    features: {
      devInteractions: { enabled: true },
      clientCredentials: { enabled: true },
      resourceIndicators: {
        enabled: true,
        defaultResource: () => 'urn:sidecar',
        useGrantedResource: () => true,
        getResourceServerInfo: (ctx, resource) => ({
          scope: 'mcp openid', audience: resource, accessTokenFormat: 'jwt',
          accessTokenTTL: ctx.oidc.client?.clientId === 'shortlived' ? 2 : 600 }),
      },
    },
    pkce: { required: () => true },
  };
}

async function start(port) {
  const issuer = `http://127.0.0.1:${port}`;
  const provider = new Provider(issuer, configuration());
  provider.proxy = false;
  await new Promise((resolve) => {
    const server = provider.listen(port, '127.0.0.1', resolve);
    provider.server = server;
  });
  return [issuer, provider];
}

async function freePort() {
  const net = await import('node:net');
  return new Promise((resolve) => {
    const srv = net.createServer();
    srv.listen(0, '127.0.0.1', () => { const { port } = srv.address(); srv.close(() => resolve(port)); });
  });
}

const [issuer] = await start(await freePort());
const [other] = await start(await freePort());
console.log(`ISSUER ${issuer}`);
console.log(`OTHER ${other}`);
