// A real MCP client, the official TypeScript SDK (@modelcontextprotocol/sdk
// 1.32.2, installed in .npm-tools by scripts/test), driving plugd's MCP
// gateway for the integration tests (crates/plugd/tests/it/gateway.rs).
//
// Usage: node ts_client.mjs PLAN_JSON, the plan as mcp_client.py reads it
// (transport stdio with command/args/env, or http with url/token; elicit:
// "accept" | null; steps: list, call with progress). Prints one JSON report.
import path from "node:path";
import { fileURLToPath } from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));
const sdk = path.join(here, "../../../.npm-tools/node_modules/@modelcontextprotocol/sdk/dist/esm");
const { Client } = await import(path.join(sdk, "client/index.js"));
const { StdioClientTransport } = await import(path.join(sdk, "client/stdio.js"));
const { StreamableHTTPClientTransport } = await import(path.join(sdk, "client/streamableHttp.js"));
const { ElicitRequestSchema, ToolListChangedNotificationSchema } = await import(path.join(sdk, "types.js"));

const plan = JSON.parse(process.argv[2]);
const report = { steps: [], elicitations: [], list_changed: 0 };
const capabilities = plan.elicit ? { elicitation: {} } : {};
const client = new Client({ name: "plugd-test-ts", version: "0" }, { capabilities });
if (plan.elicit) {
  client.setRequestHandler(ElicitRequestSchema, async (req) => {
    report.elicitations.push(req.params.message);
    return plan.elicit === "accept" ? { action: "accept", content: { approve: true } } : { action: "decline" };
  });
}
client.setNotificationHandler(ToolListChangedNotificationSchema, async () => {
  report.list_changed += 1;
});

const transport =
  plan.transport === "stdio"
    ? new StdioClientTransport({ command: plan.command, args: plan.args, env: plan.env, stderr: "inherit" })
    : new StreamableHTTPClientTransport(new URL(plan.url), {
        requestInit: { headers: { Authorization: `Bearer ${plan.token}` } },
      });
await client.connect(transport);
report.protocol_version = transport.protocolVersion ?? null;
report.server_info = client.getServerVersion() ?? null;
for (const step of plan.steps) {
  if (step.op === "list") {
    const r = await client.listTools();
    report.steps.push({ op: "list", tools: r.tools });
  } else if (step.op === "call") {
    const progress = [];
    try {
      const r = await client.callTool(
        { name: step.name, arguments: step.args ?? {} },
        undefined,
        step.progress ? { onprogress: (p) => progress.push(p) } : {},
      );
      const text = (r.content ?? []).filter((c) => c.type === "text").map((c) => c.text).join("");
      report.steps.push({ op: "call", name: step.name, is_error: !!r.isError, text, structured: r.structuredContent ?? null, progress });
    } catch (e) {
      report.steps.push({ op: "call", name: step.name, error: String(e), progress });
    }
  } else {
    throw new Error(`unknown step ${step.op}`);
  }
}
await client.close();
process.stdout.write(JSON.stringify(report) + "\n");
