// A stream cut by the server's deadline after tokens, read with the
// official npm "openai" client. Usage: node deadline.mjs <node_modules dir> <base URL>
// Prints one JSON object: the chunks received and the error thrown.
import { createRequire } from 'node:module';
import path from 'node:path';

const [nodeModules, baseURL] = process.argv.slice(2);
const require = createRequire(path.join(nodeModules, 'noop.js'));
const OpenAI = require('openai').default ?? require('openai');
const client = new OpenAI({ baseURL: baseURL + '/v1', apiKey: 'unused', maxRetries: 0 });

const out = { chunks: 0 };
try {
  const stream = await client.chat.completions.create({
    model: 'tiny', messages: [{ role: 'user', content: 'Name a color.' }],
    max_tokens: 400, ignore_eos: true, stream: true,
  });
  for await (const chunk of stream) {
    out.chunks++;
  }
} catch (e) {
  out.error = { name: e.constructor.name, isAPIError: e instanceof OpenAI.APIError, code: e.code ?? null, type: e.type ?? null, status: e.status ?? null };
}
console.log(JSON.stringify(out));
