// LoRA adapters through the official npm "openai" client: loaded and
// unloaded at run time with vLLM's endpoints (client.post), listed by
// models.list() with their parent, and chatted with under their own name.
// Usage: node adapters.mjs <openai node_modules dir> <base URL> <adapter dir>.
// Prints one JSON object for the Go test to check.
import { createRequire } from "node:module";
import path from "node:path";

const [openaiModules, base, adapterDir] = process.argv.slice(2);
const require = createRequire(path.join(openaiModules, "noop.js"));
const OpenAI = require("openai").default ?? require("openai");
const client = new OpenAI({ baseURL: base + "/v1", apiKey: "unused", maxRetries: 0 });
const out = {};

out.loaded = await client.post("/load_lora_adapter", { body: { lora_name: "sql", lora_path: adapterDir } });
const models = [];
for await (const m of client.models.list()) models.push({ id: m.id, parent: m.parent ?? null, root: m.root });
out.models = models;
const msg = [{ role: "user", content: "Write a query." }];
const chat = await client.chat.completions.create({ model: "sql", messages: msg, max_tokens: 6, temperature: 0 });
out.chat = { model: chat.model, content: chat.choices[0].message.content };
const baseChat = await client.chat.completions.create({ model: "tiny", messages: msg, max_tokens: 6, temperature: 0 });
out.baseContent = baseChat.choices[0].message.content;
await client.post("/unload_lora_adapter", { body: { lora_name: "sql" } });
try {
  await client.chat.completions.create({ model: "sql", messages: msg, max_tokens: 6 });
  out.afterUnload = 200;
} catch (e) {
  out.afterUnload = e.status;
}
console.log(JSON.stringify(out));
