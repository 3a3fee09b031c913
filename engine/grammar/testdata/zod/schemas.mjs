// Writes zod v4's JSON schemas for the field types clients send most (the
// AI SDK's generateObject and LangChain's withStructuredOutput take zod
// schemas) to zod_v4.json beside this file. Run from a directory whose
// node_modules holds zod 4 (scripts/setup.d/41-agents.sh installs it):
//
//   cp engine/grammar/testdata/zod/schemas.mjs $MLXSERVING_NPM_AGENTS/.. && \
//     (cd $MLXSERVING_NPM_AGENTS/.. && node schemas.mjs) > engine/grammar/testdata/zod/zod_v4.json
import { z } from "zod";

const fields = z.object({
  email: z.email(),
  id: z.uuid(),
  at: z.iso.datetime(),
  day: z.iso.date(),
  t: z.iso.time(),
  d: z.iso.duration(),
  ip: z.ipv4(),
  ip6: z.ipv6(),
  tags: z.record(z.string(), z.number()),
  n: z.string().nullable(),
  o: z.number().optional(),
  e: z.enum(["a", "b"]),
  u: z.union([z.string(), z.number()]),
  arr: z.array(z.object({ k: z.string() })).max(3),
});
console.log(JSON.stringify(z.toJSONSchema(fields), null, 1));
