// Tool calls and structured output through the npm openai client.
// Usage: node tools.mjs <node_modules dir> <base URL>. Prints one JSON
// object for the Go test to check.
import { createRequire } from "node:module";
import path from "node:path";

const [modules, base] = process.argv.slice(2);
const require = createRequire(path.join(modules, "noop.js"));
const OpenAI = require("openai").default ?? require("openai");
const client = new OpenAI({ baseURL: base + "/v1", apiKey: "unused", maxRetries: 0 });

const tools = [{
  type: "function",
  function: {
    name: "get_weather",
    description: "Weather in a city",
    parameters: {
      type: "object",
      properties: { city: { type: "string", maxLength: 12 }, unit: { enum: ["celsius", "fahrenheit"] } },
      required: ["city", "unit"],
      additionalProperties: false,
    },
  },
}];
const messages = [{ role: "user", content: "Weather in Paris?" }];

const whole = await client.chat.completions.create({
  model: "tiny", messages, tools, tool_choice: "required", max_tokens: 200, temperature: 1, seed: 3,
});
const call = whole.choices[0].message.tool_calls[0];

const stream = await client.chat.completions.create({
  model: "tiny", messages, tools, tool_choice: { type: "function", function: { name: "get_weather" } },
  max_tokens: 200, temperature: 1, seed: 3, stream: true,
});
let streamedName = "", streamedArgs = "", streamFinish = "", streamIndex = -1, streamID = "";
for await (const chunk of stream) {
  const c = chunk.choices[0];
  for (const tc of c?.delta?.tool_calls ?? []) {
    streamIndex = tc.index;
    streamID ||= tc.id ?? "";
    streamedName += tc.function?.name ?? "";
    streamedArgs += tc.function?.arguments ?? "";
  }
  if (c?.finish_reason) streamFinish = c.finish_reason;
}

const next = await client.chat.completions.create({
  model: "tiny", tools, max_tokens: 4,
  messages: [...messages, whole.choices[0].message, { role: "tool", tool_call_id: call.id, content: "{\"temp\":21}" }],
});

const structured = await client.chat.completions.create({
  model: "tiny", messages, max_tokens: 300, temperature: 1, seed: 5,
  response_format: { type: "json_schema", json_schema: { name: "w", strict: true, schema: tools[0].function.parameters } },
});

console.log(JSON.stringify({
  finish: whole.choices[0].finish_reason, name: call.function.name, args: call.function.arguments, id: call.id,
  streamedName, streamedArgs, streamFinish, streamIndex, streamID,
  nextFinish: next.choices[0].finish_reason,
  structured: structured.choices[0].message.content, structuredFinish: structured.choices[0].finish_reason,
}));
