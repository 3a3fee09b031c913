// Tool calling and structured output through LangChain JS and the Vercel
// AI SDK, with tool_choice required. Run from a directory whose
// node_modules holds them (the Go test links it). Usage: node agents.mjs
// <base URL>. Prints one JSON object for the Go test to check.
import { ChatOpenAI } from "@langchain/openai";
import { generateText, generateObject, tool, jsonSchema } from "ai";
import { createOpenAICompatible } from "@ai-sdk/openai-compatible";
import { z } from "zod";

const base = process.argv[2];
const weather = z.object({ city: z.string().max(12), unit: z.enum(["celsius", "fahrenheit"]) });
const out = {};

// LangChain: bindTools with a required call, then structured output.
const llm = new ChatOpenAI({
  model: "tiny", apiKey: "unused", configuration: { baseURL: base + "/v1" },
  maxTokens: 200, temperature: 1, maxRetries: 0,
});
const lcTools = llm.bindTools([{ name: "get_weather", description: "Weather in a city", schema: weather }], { tool_choice: "required" });
const msg = await lcTools.invoke("Weather in Paris?");
out.langchain = { calls: msg.tool_calls.map((c) => ({ name: c.name, args: c.args, id: c.id })) };
const structured = llm.withStructuredOutput(weather, { name: "weather", method: "jsonSchema" });
out.langchainStructured = await structured.invoke("Weather in Paris as JSON");

// Vercel AI SDK: generateText with a required tool.
const provider = createOpenAICompatible({ name: "mlxserving", baseURL: base + "/v1", apiKey: "unused" });
const r = await generateText({
  model: provider("tiny"),
  prompt: "Weather in Paris?",
  tools: { get_weather: tool({ description: "Weather in a city", inputSchema: weather }) },
  toolChoice: "required",
  maxOutputTokens: 200,
  temperature: 1,
  seed: 3,
});
out.aisdk = { calls: r.toolCalls.map((c) => ({ name: c.toolName, args: c.input ?? c.args, id: c.toolCallId })), finish: r.finishReason };
// zod v4 field types clients use most (formats carry zod's own patterns,
// records, unions, discriminated unions, defaults, nullable and optional
// fields, arrays of objects): every path must return an object zod
// itself accepts.
// Free strings carry a length bound, record keys included (zod sends it as
// propertyNames' maxLength), as schemas for a small model should.
const profile = z.object({
  email: z.email().max(40), id: z.uuid(), at: z.iso.datetime(), day: z.iso.date(), d: z.iso.duration(),
  ip: z.ipv4(), scores: z.record(z.string().max(8), z.number()).optional(), nick: z.string().max(16).nullable(),
});
const big = new ChatOpenAI({
  model: "tiny", apiKey: "unused", configuration: { baseURL: base + "/v1" },
  maxTokens: 440, temperature: 1, maxRetries: 0,
});
out.zod = { checks: {} };
for (const method of ["jsonSchema", "functionCalling"]) {
  const got = await big.withStructuredOutput(profile, { name: "profile", method }).invoke("A profile as JSON");
  out.zod.checks[method] = profile.safeParse(got).success;
}
const structuredProvider = createOpenAICompatible({ name: "mlxserving", baseURL: base + "/v1", apiKey: "unused", supportsStructuredOutputs: true });
const obj = await generateObject({ model: structuredProvider("tiny"), schema: profile, prompt: "A profile", maxOutputTokens: 440, temperature: 1, seed: 5 });
out.zod.checks.generateObject = profile.safeParse(obj.object).success;
// Unions, discriminated unions, defaults, optional and nullable fields and
// arrays of objects, small enough for the test model's 512-token context.
const order = z.object({
  delivery: z.discriminatedUnion("type", [
    z.object({ type: z.literal("pickup"), store: z.string().max(6) }),
    z.object({ type: z.literal("ship"), zip: z.string().regex(/^[0-9]{5}$/) }),
  ]),
  qty: z.union([z.number().int().min(1).max(9), z.literal("many")]),
  gift: z.boolean().default(false),
  lines: z.array(z.object({ sku: z.string().max(6), n: z.number().int().min(1).max(9) })).min(1).max(2),
  note: z.string().max(8).nullable().optional(),
});
for (const method of ["jsonSchema", "functionCalling"]) {
  const got = await big.withStructuredOutput(order, { name: "order", method }).invoke("An order as JSON");
  out.zod.checks["order/" + method] = order.safeParse(got).success;
}
const ord = await generateObject({ model: structuredProvider("tiny"), schema: order, prompt: "An order", maxOutputTokens: 440, temperature: 1, seed: 7 });
out.zod.checks["order/generateObject"] = order.safeParse(ord.object).success;
// output: 'array' on items without .max(), as a new user writes it, with
// small budgets: the server closes the array within maxOutputTokens, so
// every reply parses (issue 38), cut short with finishReason "length".
const item = z.object({ name: z.string(), score: z.number() });
out.zod.array = [];
for (const max of [40, 64, 100]) {
  const arr = await generateObject({ model: structuredProvider("tiny"), output: "array", schema: item, prompt: "Some items", maxOutputTokens: max, temperature: 1, seed: max });
  out.zod.array.push(z.array(item).safeParse(arr.object).success);
}
console.log(JSON.stringify(out));
