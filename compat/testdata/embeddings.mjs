// Embeddings through the official npm "openai" client (embeddings.create,
// whose default asks for base64 and decodes it, and encoding_format
// "float") and the Vercel AI SDK's embedMany. Run from a directory whose
// node_modules holds the AI SDK (the Go test links it). Usage:
// node embeddings.mjs <openai node_modules dir> <base URL>. Prints one
// JSON object for the Go test to check.
import { createRequire } from "node:module";
import path from "node:path";
import { embedMany, embed } from "ai";
import { createOpenAICompatible } from "@ai-sdk/openai-compatible";

const [openaiModules, base] = process.argv.slice(2);
const require = createRequire(path.join(openaiModules, "noop.js"));
const OpenAI = require("openai").default ?? require("openai");
const client = new OpenAI({ baseURL: base + "/v1", apiKey: "unused", maxRetries: 0 });
const texts = ["The quick brown fox", "jumps over the lazy dog", "The quick brown fox"];
const out = {};

const def = await client.embeddings.create({ model: "tiny", input: texts });
out.openai = { vectors: def.data.map((d) => Array.from(d.embedding)), index: def.data.map((d) => d.index), usage: def.usage };
const fl = await client.embeddings.create({ model: "tiny", input: texts[0], encoding_format: "float" });
out.openaiFloat = fl.data[0].embedding;
try {
  await client.embeddings.create({ model: "tiny", input: "" });
  out.emptyStatus = 200;
} catch (e) {
  out.emptyStatus = e.status;
  out.emptyParam = e.param;
}

const provider = createOpenAICompatible({ name: "mlxserving", baseURL: base + "/v1", apiKey: "unused" });
const many = await embedMany({ model: provider.embeddingModel("tiny"), values: texts, maxRetries: 0 });
out.aisdk = { vectors: many.embeddings, tokens: many.usage?.tokens };
const one = await embed({ model: provider.embeddingModel("tiny"), value: texts[1], maxRetries: 0 });
out.aisdkOne = one.embedding;
console.log(JSON.stringify(out));
