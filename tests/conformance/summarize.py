"""Summarizes one conformance run for scripts/conformance.

Reads the runner's per-scenario `checks.json` files (`conformance server -o
DIR` writes DIR/server-<scenario>-<timestamp>/checks.json, `conformance
client -o DIR` DIR/<scenario>-<timestamp>/checks.json, the scenario name
possibly holding a `/`) and the expected-failures baseline, prints one line per scenario and the closing
line `N passed, M failed` (M: unexpected failures only), and writes the
same as a Markdown table (what tests/conformance/RESULTS.md holds).

A scenario fails when any of its checks is FAILURE or WARNING: the
runner's own rule for the baseline. Exit status 1 when a scenario fails
that the baseline does not list, when a listed one passes (stale entry),
or when the run produced no results at all.

With `--requirements FILE` (the runner's `requirements/<revision>.yaml`),
the scenarios it runs but never scores (`not_scored`: extension, pending,
added after the release) are marked so in the table; the baseline still
covers them (a failure there is listed with its reason like any other).

The baseline is the runner's YAML (`server: [scenario, ...]`, `client:
[...]`; `--suite` says which list applies); the reason
for each entry is the comment on its line (`- name  # reason`). Parsed
here with a regex so this needs only the standard library.
"""

import argparse
import datetime
import json
import re
import sys
from pathlib import Path

STAMP = r"-\d{4}-\d{2}-\d{2}T\d{2}-\d{2}-\d{2}-\d{3}Z$"
DIR_NAME = re.compile(r"^server-(?P<scenario>.+)" + STAMP)
CLIENT_DIR = re.compile(r"^(?P<scenario>.+)" + STAMP)
ENTRY = re.compile(r"^\s*-\s*(?P<name>[A-Za-z0-9_./-]+)\s*(?:#\s*(?P<reason>.*))?$")


def baseline(path: Path, suite: str) -> dict[str, str]:
    """Scenario -> reason of the suite's list (`server:` or `client:`)."""
    out: dict[str, str] = {}
    section = None
    for line in path.read_text().splitlines():
        if re.match(r"^[A-Za-z_]+\s*:", line):
            section = line.split(":", 1)[0].strip()
            continue
        m = ENTRY.match(line)
        if m and section == suite:
            out[m["name"]] = (m["reason"] or "").strip()
    return out


def not_scored(path: Path | None) -> dict[str, str]:
    """Scenario -> why the requirement set runs it unscored (its `reason`)."""
    out: dict[str, str] = {}
    if path is None or not path.exists():
        return out
    scenario = None
    inside = False
    for line in path.read_text().splitlines():
        if re.match(r"^[A-Za-z_]+\s*:", line):
            inside = line.startswith("not_scored")
            continue
        if not inside:
            continue
        m = re.match(r"^\s*-\s*scenario:\s*(\S+)", line)
        if m:
            scenario = m[1]
            continue
        m = re.match(r"^\s*reason:\s*(\S+)", line)
        if m and scenario:
            out[scenario] = m[1]
    return out


def results(root: Path, suite: str) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    if suite == "server":
        for checks in sorted(root.glob("server-*/checks.json")):
            m = DIR_NAME.match(checks.parent.name)
            if m:
                out[m["scenario"]] = json.loads(checks.read_text())
        return out
    for checks in sorted(root.glob("**/checks.json")):
        m = CLIENT_DIR.match(checks.parent.relative_to(root).as_posix())
        if m:
            out[m["scenario"]] = json.loads(checks.read_text())
    return dict(sorted(out.items()))


def first_problem(checks: list[dict]) -> str:
    for c in checks:
        if c.get("status") in ("FAILURE", "WARNING"):
            msg = c.get("errorMessage") or c.get("description") or ""
            return f"{c.get('name', c.get('id'))}: {' '.join(str(msg).split())}"[:200]
    return ""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--suite", choices=["server", "client"], default="server")
    ap.add_argument("--results", type=Path, required=True)
    ap.add_argument("--baseline", type=Path, required=True)
    ap.add_argument("--version", required=True, help="the conformance package's version")
    ap.add_argument("--markdown", type=Path, required=True)
    ap.add_argument("--plugd", default="plugd", help="what was tested: plugd's version and commit")
    ap.add_argument("--era", default="2025-11-25", help="the protocol revision the run tests")
    ap.add_argument("--requirements", type=Path, help="the runner's requirements/<revision>.yaml")
    args = ap.parse_args()
    sys.stdout.reconfigure(line_buffering=True)  # keep the closing line last beside stderr

    expected = baseline(args.baseline, args.suite)
    runs = results(args.results, args.suite)
    unscored = not_scored(args.requirements)
    rows = []
    passed = unexpected = stale = expected_failed = 0
    scored = {"passed": 0, "failed": 0}
    for scenario, checks in runs.items():
        failed = any(c.get("status") in ("FAILURE", "WARNING") for c in checks)
        listed = scenario in expected
        if scenario not in unscored:
            scored["failed" if failed else "passed"] += 1
        if failed and listed:
            expected_failed += 1
            rows.append((scenario, "fail (expected)", expected[scenario] or first_problem(checks)))
        elif failed:
            unexpected += 1
            rows.append((scenario, "FAIL (unexpected)", first_problem(checks)))
        elif listed:
            passed += 1
            stale += 1
            rows.append((scenario, "pass (STALE: listed as expected failure)", "remove it from expected-failures.yaml"))
        else:
            passed += 1
            rows.append((scenario, "pass", ""))

    width = max((len(r[0]) for r in rows), default=0)
    rows = [(s, f"{r} (not scored: {unscored[s]})" if s in unscored else r, why) for s, r, why in rows]
    for scenario, result, reason in rows:
        print(f"{scenario:<{width}}  {result}{'  ' + reason if reason else ''}")

    today = datetime.datetime.now(datetime.timezone.utc).date().isoformat()
    md = (client_header if args.suite == "client" else server_header)(args, today)
    md += [f"**{passed} passed, {expected_failed} failed as expected, {unexpected} failed unexpectedly.**", ""]
    if unscored:
        md += [
            f"Of the {scored['passed'] + scored['failed']} scenarios the {args.era} requirement set scores, "
            f"**{scored['passed']} pass**; the others are run and reported but never scored "
            "(extension, pending, added after the release).",
            "",
        ]
    md += [
        "| Scenario | Result | Reason |",
        "| --- | --- | --- |",
    ]
    md += [f"| `{s}` | {r} | {reason.replace('|', '/')} |" for s, r, reason in rows]
    args.markdown.write_text("\n".join(md) + "\n")

    if not runs:
        print(f"error: no checks.json under {args.results}; the runner produced no results", file=sys.stderr)
    if expected_failed:
        print(f"({expected_failed} expected failures, listed in {args.baseline.name})")
    if stale:
        print(f"error: {stale} scenario(s) listed as expected failures pass now; remove them from {args.baseline.name}",
              file=sys.stderr)
    print(f"{passed} passed, {unexpected} failed")
    return 1 if unexpected or stale or not runs else 0


def server_header(args: argparse.Namespace, today: str) -> list[str]:
    if args.era != "2025-11-25":
        return [
            "",
            f"# MCP {args.era}",
            "",
            f"The official MCP conformance server suite, `@modelcontextprotocol/conformance@{args.version}`",
            f"(`--requirements {args.era}`: the revision's frozen requirement set, run at its stateless wire,",
            "and the extension and pending scenarios it runs unscored), against the same gateway and fixture,",
            f"run on {today} ({args.plugd}). Each scenario's checks are in",
            f"`target/conformance/{args.era}/server-<scenario>-<time>/checks.json`; failures the",
            f"baseline expects are listed, with their reasons, in `expected-failures-{args.era}.yaml`.",
            "",
            "## Server suite",
            "",
        ]
    return [
        "# MCP conformance results",
        "",
        "Two eras of the protocol, each by its own pinned runner and baseline: 2025-11-25 (0.1.16, first)",
        "and the stateless 2026-07-28 (0.2.0, after it).",
        "",
        "# MCP 2025-11-25",
        "",
        f"The official MCP conformance server suite, `@modelcontextprotocol/conformance@{args.version}`",
        "(`--suite all`: the `active` scenarios and the `pending` ones), against `plugd serve`'s Streamable HTTP gateway at",
        "`/mcp/conformance` hosting `tests/conformance/workspace/conformance_server.py`,",
        f"run on {today} ({args.plugd}).",
        "",
        "Re-run with `scripts/conformance` (after `cargo build --bins`); it writes this",
        "table to `target/conformance/RESULTS.md` and each scenario's checks to",
        "`target/conformance/server-<scenario>-<time>/checks.json`. Failures the",
        "baseline expects are listed, with their reasons, in `expected-failures.yaml`.",
        "",
        "## Server suite",
        "",
    ]


def client_header(args: argparse.Namespace, today: str) -> list[str]:
    if args.era != "2025-11-25":
        return [
            "",
            "## Client suite",
            "",
            f"The official MCP conformance client suite, `@modelcontextprotocol/conformance@{args.version}`",
            f"(`--requirements {args.era}`, its scenarios side by side), against plugd's MCP client the same way",
            f"as above; run on {today} ({args.plugd}). Each scenario's checks, and the client's output, are in",
            f"`target/conformance/{args.era}/client/<scenario>-<time>/`.",
            "",
        ]
    return [
        "",
        "## Client suite",
        "",
        f"The official MCP conformance client suite, `@modelcontextprotocol/conformance@{args.version}`",
        "(every client scenario `conformance list` names, the draft and extension ones included, one at a time), against plugd's",
        "MCP client for remote servers (Streamable HTTP, OAuth): for each scenario the runner starts a test",
        "server and runs `tests/conformance/client.sh URL`, which declares it in a temporary workspace's",
        "`.mcp.json`, logs in with `plugd mcp login` (curl as the browser) where the scenario needs",
        "authorization, and lists and calls its tools with `plugd tool list|call`;",
        f"run on {today} ({args.plugd}). Each scenario's checks, and the client's output, are in",
        "`target/conformance/client/<scenario>-<time>/`.",
        "",
    ]


if __name__ == "__main__":
    sys.exit(main())
