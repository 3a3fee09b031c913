// Drives an mlxserving OpenAI-compatible server with the official npm
// "openai" client. Usage: node client.mjs <node_modules dir> <base URL>
// Prints one JSON object with what it saw; exits non-zero on a failed check.
import { createRequire } from 'node:module';
import path from 'node:path';

const [nodeModules, baseURL] = process.argv.slice(2);
const require = createRequire(path.join(nodeModules, 'noop.js'));
const OpenAI = require('openai').default ?? require('openai');

const client = new OpenAI({ baseURL: baseURL + '/v1', apiKey: 'unused', maxRetries: 0 });
const fail = (msg) => { console.error(msg); process.exit(1); };
const out = {};

const params = {
  model: 'tiny',
  messages: [{ role: 'user', content: [{ type: 'text', text: 'Name a color.' }] }],
  max_tokens: 10,
  temperature: 0,
  ignore_eos: true,
};

const whole = await client.chat.completions.create(params);
if (whole.choices[0].message.role !== 'assistant') fail('role ' + whole.choices[0].message.role);
if (whole.usage.completion_tokens !== 10) fail('usage ' + JSON.stringify(whole.usage));
out.text = whole.choices[0].message.content;
out.finish = whole.choices[0].finish_reason;
out.cachedTokens = whole.usage.prompt_tokens_details.cached_tokens;

const stream = await client.chat.completions.create({ ...params, stream: true, stream_options: { include_usage: true } });
let streamed = '';
let chunks = 0;
for await (const chunk of stream) {
  chunks++;
  if (chunk.choices.length > 0) streamed += chunk.choices[0].delta.content ?? '';
  if (chunk.usage) out.streamUsage = chunk.usage.completion_tokens;
}
out.streamed = streamed;
out.chunks = chunks;

const completion = await client.completions.create({ model: 'tiny', prompt: 'Once upon a time', max_tokens: 4, ignore_eos: true });
out.completionTokens = completion.usage.completion_tokens;

try {
  await client.chat.completions.create({ ...params, model: 'missing-model' });
  fail('unknown model accepted');
} catch (err) {
  if (!(err instanceof OpenAI.APIError)) fail('not an APIError: ' + err);
  out.errorStatus = err.status;
  out.errorCode = err.code;
  out.errorParam = err.param;
}
try {
  await client.chat.completions.create({ ...params, top_p: 0 });
  fail('top_p 0 accepted');
} catch (err) {
  out.badParamStatus = err.status;
  out.badParam = err.param;
}
const models = await client.models.list();
out.models = models.data.map((m) => m.id);
console.log(JSON.stringify(out));
