// Reasoning output through the npm openai client: reasoning_content in a
// whole reply's message and in streamed deltas, separate_reasoning and
// chat_template_kwargs passed as extra body fields.
// Usage: node reasoning.mjs <node_modules dir> <base URL>. Prints one JSON
// object for the Go test to check.
import { createRequire } from "node:module";
import path from "node:path";

const [modules, base] = process.argv.slice(2);
const require = createRequire(path.join(modules, "noop.js"));
const OpenAI = require("openai").default ?? require("openai");
const client = new OpenAI({ baseURL: base + "/v1", apiKey: "unused", maxRetries: 0 });

const params = {
  model: "tiny", messages: [{ role: "user", content: "2+2?" }], max_tokens: 8, temperature: 0, ignore_eos: true,
};

async function streamed(extra) {
  const stream = await client.chat.completions.create({ ...params, ...extra, stream: true });
  let reasoning = "", content = "";
  for await (const chunk of stream) {
    const d = chunk.choices[0]?.delta ?? {};
    reasoning += d.reasoning_content ?? "";
    content += d.content ?? "";
  }
  return { reasoning, content };
}

const whole = (await client.chat.completions.create(params)).choices[0].message;
const raw = (await client.chat.completions.create({ ...params, separate_reasoning: false })).choices[0].message;
const off = (await client.chat.completions.create({ ...params, chat_template_kwargs: { enable_thinking: false } })).choices[0].message;
console.log(JSON.stringify({
  reasoning: whole.reasoning_content ?? null,
  content: whole.content,
  raw: raw.content,
  rawReasoning: raw.reasoning_content ?? null,
  stream: await streamed({}),
  offReasoning: off.reasoning_content ?? null,
  offContent: off.content,
  offStream: await streamed({ chat_template_kwargs: { enable_thinking: false } }),
}));
