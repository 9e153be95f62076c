#!/usr/bin/env python3
"""Keeps the operator's and the client author's documents in step with the code:

  docs_check.py metrics   SOURCE   every outlive_* metric that docs/OPERATING.md or the Grafana
                                   dashboard names is registered in src/, every metric src/
                                   registers is in docs/OPERATING.md, and its alert rules pass
                                   `promtool check rules`
  docs_check.py protocol  SOURCE   docs/PROTOCOL.md names every error code, close code, frame
                                   type and resync reason the server can send
  docs_check.py links     SOURCE   every relative link in README, CHANGELOG, docs/ and the deploy
                                   READMEs reaches a file inside the repository (and its heading)
  docs_check.py self-test SOURCE   each check catches a name or link the other side lacks

The code side is read from the sources with patterns for the few ways they name these things
(registry calls, refusals, send_error, the CloseCode enum, FrameReader::fail, frame builders), so
a new metric or error code without its line in the docs fails the test.
Exit 0: in step; 1: differences, each printed.
"""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

SUFFIXES = ("_sum", "_count", "_bucket")


def sources(root, exts=(".cpp", ".hpp")):
    out = {}
    for base, _, files in os.walk(os.path.join(root, "src")):
        for f in files:
            if f.endswith(exts):
                path = os.path.join(base, f)
                out[os.path.relpath(path, root)] = open(path, encoding="utf-8").read()
    return out


def read(root, rel):
    return open(os.path.join(root, rel), encoding="utf-8").read()


# --- metrics ------------------------------------------------------------------------------------

def registered_metrics(src):
    """Names passed to the registry (counter/gauge/observe) or to a prometheus-cpp builder."""
    pattern = re.compile(r'(?:\b(?:counter|gauge|observe|histogram|summary)\s*\(|\.Name\s*\()'
                         r'\s*"(outlive_[a-z0-9_]+)"')
    return {m.group(1) for text in src.values() for m in pattern.finditer(text)}


def literal_names(src):
    return {m.group(1) for text in src.values()
            for m in re.finditer(r'"(outlive_[a-z0-9_]+)"', text)}


def named_metrics(text):
    """outlive_* names in a text, a summary's or histogram's _sum/_count/_bucket series counted
    as their metric."""
    return {next((n[:-len(s)] for s in SUFFIXES if n.endswith(s)), n)
            for n in re.findall(r"\boutlive_[a-z0-9_]+", text)}


def check_rules(operating):
    """The alert examples are a Prometheus rule file an operator can copy: YAML, groups of rules
    each with an alert name, an expression and well-formed durations and labels."""
    import yaml
    failures = []
    blocks = re.findall(r"```yaml\n(.*?)```", operating, re.S)
    if not blocks:
        return ["docs/OPERATING.md: no ```yaml block of alert rules"]
    for block in blocks:
        try:
            doc = yaml.safe_load(block)
        except yaml.YAMLError as e:
            failures.append(f"docs/OPERATING.md: the rules are not YAML: {e}")
            continue
        for group in (doc or {}).get("groups") or [None]:
            if not isinstance(group, dict) or not group.get("name") or not group.get("rules"):
                failures.append("docs/OPERATING.md: a rule group without name or rules")
                continue
            for rule in group["rules"]:
                name = rule.get("alert", "?")
                extra = set(rule) - {"alert", "expr", "for", "labels", "annotations"}
                if extra:
                    failures.append(f"rule {name}: unknown keys {sorted(extra)}")
                if not rule.get("alert") or not isinstance(rule.get("expr"), str):
                    failures.append(f"rule {name}: needs alert and expr")
                elif rule["expr"].count("(") != rule["expr"].count(")"):
                    failures.append(f"rule {name}: unbalanced parentheses in expr")
                if "for" in rule and not re.fullmatch(r"\d+[smhd]", str(rule["for"])):
                    failures.append(f"rule {name}: `for: {rule['for']}` is not a duration")
                for k, v in (rule.get("labels") or {}).items():
                    if not isinstance(v, str):
                        failures.append(f"rule {name}: label {k} is not a string")
        failures += promtool_check(block)
    return failures


def promtool_check(rules):
    """Prometheus' own parser on the rules (PromQL included): Debian's prometheus package."""
    tool = shutil.which("promtool") or "/usr/bin/promtool"
    if not os.path.exists(tool):
        return ["promtool not found (scripts/install-deps.sh installs Debian's prometheus)"]
    with tempfile.NamedTemporaryFile("w", suffix=".yml", delete=False) as f:
        f.write(rules)
    try:
        r = subprocess.run([tool, "check", "rules", f.name], capture_output=True, text=True,
                           timeout=60)
    finally:
        os.unlink(f.name)
    if r.returncode == 0:
        return []
    said = " ".join(l.strip() for l in (r.stdout + r.stderr).splitlines()
                    if l.strip() and "Checking" not in l)
    return [f"promtool check rules: {said.replace(f.name, 'the rules')}"]


def check_dashboard_queries(dashboard):
    """Each panel's query through PromQL's parser: as recording rules for promtool, Grafana's
    variables replaced by what they expand to."""
    exprs = [t["expr"] for p in dashboard.get("panels", []) for t in p.get("targets", [])]
    if not exprs:
        return ["deploy/grafana/outlive.json: no queries"]
    rules = {"groups": [{"name": "dashboard", "rules": [
        {"record": f"dashboard:query{i}", "expr": re.sub(
            r"\$(job|instance|app)\b", ".*", e.replace("$__rate_interval", "1m"))}
        for i, e in enumerate(exprs)]}]}
    return [f.replace("promtool check rules", "a dashboard query") for f in
            promtool_check(json.dumps(rules))]


def check_metrics(root, operating=None, dashboard=None, src=None):
    failures = []
    src = src if src is not None else sources(root)
    operating = operating if operating is not None else read(root, "docs/OPERATING.md")
    dashboard = dashboard if dashboard is not None else read(root, "deploy/grafana/outlive.json")
    try:
        failures += check_dashboard_queries(json.loads(dashboard))
    except ValueError as e:
        failures.append(f"deploy/grafana/outlive.json is not JSON: {e}")
    failures += check_rules(operating)
    registered = registered_metrics(src)
    known = registered | literal_names(src)
    if not registered:
        failures.append("no metric registration found in src/ (has the registry's API changed?)")
    for where, text in (("docs/OPERATING.md", operating),
                        ("deploy/grafana/outlive.json", dashboard)):
        for name in sorted(named_metrics(text)):
            if name not in known:
                failures.append(f"{where} names {name}, which src/ does not export")
    documented = named_metrics(operating)
    for name in sorted(registered - documented):
        failures.append(f"src/ exports {name}, which docs/OPERATING.md does not describe")
    return failures


# --- protocol -----------------------------------------------------------------------------------

def protocol_terms(src):
    """(error codes, close codes, frame types, resync and revoked reasons) the server sends."""
    text = "\n".join(src.values())
    errors = set()
    for pat in (r'send_error\(\s*"([a-z_]+)"', r'Refusal\{\s*"([a-z_]+)"',
                r'refuse\(\s*\{\s*"([a-z_]+)"', r'ProtocolError\{\s*"([a-z_]+)"',
                r'\{"error",\s*"([a-z_]+)"\}'):
        errors |= set(re.findall(pat, text))
    closes = set(re.findall(r"\bk[A-Z][A-Za-z]* = (1\d\d\d),", text))
    closes |= set(re.findall(r"\bfail\((1\d\d\d),", text))
    closes |= set(re.findall(r'Refusal\{[^}]*?,\s*(1\d\d\d)\}', text))
    frames = set(re.findall(r'\{"type",\s*"([a-z]+)"\}', text))
    frames |= set(re.findall(r'\\?"type\\?":\\?"([a-z]+)\\?"', text))
    frames |= set(re.findall(r'R"\(\{"type":"([a-z]+)"', text))
    frames |= set(re.findall(r'R"\(,"type":"([a-z]+)"', text))
    reasons = set(re.findall(r'resync\([^;]*?"([a-z_]+)"\)', text, re.S))
    reasons |= set(re.findall(r'revoked\([^)]*std::string_view reason = "([a-z_]+)"', text))
    return errors, closes, frames, reasons


def check_protocol(root, protocol=None, src=None):
    failures = []
    src = src if src is not None else sources(root)
    protocol = protocol if protocol is not None else read(root, "docs/PROTOCOL.md")
    errors, closes, frames, reasons = protocol_terms(src)
    for kind, found, minimum in (("error code", errors, 8), ("close code", closes, 6),
                                 ("frame type", frames, 6), ("reason", reasons, 4)):
        if len(found) < minimum:
            failures.append(f"found only {len(found)} {kind}s in src/ ({sorted(found)}): "
                            "has the way the code names them changed?")
        for term in sorted(found):
            if not re.search(rf"`[^`\n]*\b{re.escape(term)}\b[^`\n]*`|\| {re.escape(term)} \|",
                             protocol):
                failures.append(f"docs/PROTOCOL.md does not mention the {kind} {term}")
    return failures


# --- links --------------------------------------------------------------------------------------

def slug(heading):
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path):
    out, seen, in_code = set(), {}, False
    for line in open(path, encoding="utf-8"):
        if line.startswith("```"):
            in_code = not in_code
        m = None if in_code else re.match(r"#{1,6} (.*)", line)
        if m:
            a = slug(m.group(1))
            n = seen.get(a, 0)
            seen[a] = n + 1
            out.add(a if n == 0 else f"{a}-{n}")
    return out


def link_documents(root):
    docs = ["README.md", "CHANGELOG.md"]
    docs += [os.path.join("docs", f) for f in sorted(os.listdir(os.path.join(root, "docs")))
             if f.endswith(".md")]
    for base, _, files in os.walk(os.path.join(root, "deploy")):
        docs += [os.path.relpath(os.path.join(base, f), root) for f in files if f == "README.md"]
    return docs


def check_links(root, texts=None):
    """Every relative link of the repository's documents reaches a file, and its #anchor a
    heading: the repository must read on its own (no ../shared), and moving a document must not
    leave dead links behind."""
    failures = []
    texts = texts or {d: read(root, d) for d in link_documents(root)}
    for doc, text in texts.items():
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target):
                continue  # http(s), mailto
            path, _, anchor = target.partition("#")
            top = os.path.abspath(root)
            full = os.path.normpath(os.path.join(top, os.path.dirname(doc), path)) if path \
                else os.path.join(top, doc)
            if os.path.commonpath([top, full]) != top:
                failures.append(f"{doc}: {target} leaves the repository")
            elif not os.path.exists(full):
                failures.append(f"{doc}: {target} does not exist")
            elif anchor and full.endswith(".md") and anchor not in anchors(full):
                failures.append(f"{doc}: {target}: no heading with that anchor")
    return failures


# --- each check must catch a difference ---------------------------------------------------------

def self_test(root):
    src = sources(root)
    operating = read(root, "docs/OPERATING.md")
    dashboard = read(root, "deploy/grafana/outlive.json")
    protocol = read(root, "docs/PROTOCOL.md")
    extra = dict(src)
    extra["src/x.cpp"] = ('m.counter("outlive_brand_new_total", "x");\n'
                          'send_error("brand_new_code", "x", id);\n'
                          'enum Y { kBrandNew = 1014, };\n'
                          'send_text(tab::frames::resync(id, c, "brand_new_reason"));\n')
    cases = {
        "metrics: a documented metric the code lacks": check_metrics(
            root, operating + "\n`outlive_gone_total`\n", dashboard, src),
        "metrics: a dashboard metric the code lacks": check_metrics(
            root, operating, dashboard.replace("outlive_sockets{", "outlive_socketz{"), src),
        "metrics: an exported metric the docs lack": check_metrics(
            root, operating, dashboard, extra),
        "metrics: a dashboard query PromQL refuses": check_metrics(
            root, operating, dashboard.replace("sum(outlive_sockets{", "sum(outlive_sockets{{", 1),
            src),
        "metrics: a broken alert rule": check_rules(operating.replace("for: 2m", "for: soon", 1)),
        "metrics: an alert expression PromQL refuses": check_rules(
            operating.replace("> 60", "> > 60", 1)),
        "protocol: a new error code": [f for f in check_protocol(root, protocol, extra)
                                       if "brand_new_code" in f],
        "protocol: a new close code": [f for f in check_protocol(root, protocol, extra)
                                       if "1014" in f],
        "protocol: a new resync reason": [f for f in check_protocol(root, protocol, extra)
                                          if "brand_new_reason" in f],
        "protocol: a code dropped from the docs": check_protocol(
            root, protocol.replace("too_many_sockets", "too-many-sockets"), src),
        "links: a file outside the repository": check_links(
            root, {"README.md": "[SPEC](../shared/SPEC.md)"}),
        "links: a missing anchor": check_links(
            root, {"docs/BENCHMARKS.md": "[x](benchmarks-history/BENCHMARKS-2026-11-29-to-12-03.md#nope)"}),
    }
    ok = True
    for name, caught in cases.items():
        print(f"{'caught' if caught else 'MISSED'}: {name}" + (f" ({caught[0]})" if caught else ""))
        ok = ok and bool(caught)
    return ok


def main():
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    mode, root = sys.argv[1], sys.argv[2]
    if mode == "self-test":
        return 0 if self_test(root) else 1
    failures = {"metrics": check_metrics, "protocol": check_protocol,
                "links": check_links}[mode](root)
    for f in failures:
        print(f"FAIL {f}")
    print(f"{mode}: {'in step' if not failures else f'{len(failures)} difference(s)'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
