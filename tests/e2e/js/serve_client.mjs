// A TypeScript-SDK client of `mcpsync serve` (npm @modelcontextprotocol/sdk, as installed by
// scripts/install-npm-servers). Usage: node serve_client.mjs URL TOKEN URI
// Prints one JSON object per line: {step: "listed"|"read"|"subscribed"|"updated"|"reread"|"error", ...}.
// After "subscribed" it reads again on every notifications/resources/updated naming URI until the
// bytes change (60 s at most), then prints "updated" (with the notifications seen) and "reread".
import { createRequire } from "node:module";
import path from "node:path";

const prefix = process.env.MCPSYNC_NPM_PREFIX;
const require = createRequire(path.join(prefix, "node_modules", "x.js"));
const { Client } = require("@modelcontextprotocol/sdk/client/index.js");
const { StreamableHTTPClientTransport } = require("@modelcontextprotocol/sdk/client/streamableHttp.js");
const { ResourceUpdatedNotificationSchema } = require("@modelcontextprotocol/sdk/types.js");

const [url, token, uri] = process.argv.slice(2);
const say = (o) => process.stdout.write(JSON.stringify(o) + "\n");
const client = new Client({ name: "serve-ts-test", version: "0.0.1" });
const transport = new StreamableHTTPClientTransport(new URL(url), {
  requestInit: { headers: { Authorization: `Bearer ${token}` } },
});
const part = (r) => {
  const c = r.contents[0];
  return { text: c.text ?? null, blob: c.blob ?? null, mimeType: c.mimeType ?? null,
           digest: (r._meta ?? {})["io.mcpsync/freshness"]?.digest ?? null };
};
try {
  await client.connect(transport);
  const listed = await client.listResources();
  say({ step: "listed", protocol: transport.protocolVersion ?? null,
        resources: listed.resources.map((r) => ({ uri: r.uri, digest: r._meta?.["io.mcpsync/freshness"]?.digest })) });
  if (listed.resources.some((r) => r.uri === uri)) {
    const first = part(await client.readResource({ uri }));
    say({ step: "read", ...first });
    // Every updated notification is a cue to read again: the first one answers the subscribe (the
    // current version), a later one a change; "updated" is printed once a read has new bytes.
    let notified = 0;
    let wake = () => {};
    client.setNotificationHandler(ResourceUpdatedNotificationSchema, (n) => {
      if (n.params.uri === uri) { notified += 1; wake(); }
    });
    await client.subscribeResource({ uri });
    say({ step: "subscribed" });
    const timer = setTimeout(() => { say({ step: "error", message: "no update in 60 s" }); process.exit(3); }, 60000);
    let seen = 0;
    for (;;) {
      if (notified === seen) await new Promise((resolve) => { wake = resolve; });
      seen = notified;
      const again = part(await client.readResource({ uri }));
      if (again.digest !== first.digest) {
        clearTimeout(timer);
        say({ step: "updated", notifications: seen });
        say({ step: "reread", ...again });
        break;
      }
    }
  } else {
    try {
      await client.readResource({ uri });
      say({ step: "read", unexpected: true });
    } catch (err) {
      say({ step: "error", code: err.code ?? null, message: String(err.message ?? err) });
    }
  }
  await client.close();
  process.exit(0);
} catch (err) {
  say({ step: "error", code: err.code ?? null, message: String(err.message ?? err) });
  process.exit(2);
}
