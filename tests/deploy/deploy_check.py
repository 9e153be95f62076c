#!/usr/bin/env python3
"""Checks the deployment files offline (tests/deploy/CMakeLists.txt registers each mode):

  deploy_check.py k8s        SOURCE   deploy/k8s/*.yaml against the Kubernetes API models, then
                                      the cross-references a rollout depends on
  deploy_check.py dockerfile SOURCE   the image's ENTRYPOINT, CMD, HEALTHCHECK and user
  deploy_check.py systemd    SOURCE   systemd-analyze verify of deploy/systemd/outlive.service
  deploy_check.py self-test  SOURCE   each check above, fed a broken copy, must fail

The Kubernetes models are Debian's python3-kubernetes (the OpenAPI-generated client): every field
name, every type and every required field of each object is checked against them, so an offline
run needs no API server and no downloaded JSON schemas. What the API server would also refuse
(a selector that matches no pod template, a probe on a port that does not exist) and what the
rollout needs (preStop within the grace period, the Secret as a file) is checked by hand below.
Exit 0: valid; 1: failures, each printed.
"""
import copy
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

import yaml

failures = []


def fail(what):
    failures.append(what)


# --- YAML, strictly: a duplicate key is an error, not a silent override ---------------------------

class StrictLoader(yaml.SafeLoader):
    pass


def _mapping(loader, node, deep=False):
    seen = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r}", key_node.start_mark)
        seen.add(key)
    return loader.construct_mapping(node, deep=deep)


StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping)


def load_documents(path):
    with open(path, encoding="utf-8") as f:
        return [d for d in yaml.load_all(f, Loader=StrictLoader) if d is not None]


# --- the Kubernetes API models ------------------------------------------------------------------

def model_class(api_version, kind):
    import kubernetes.client as k8s
    version = api_version.split("/")[-1]
    name = version[0].upper() + version[1:] + kind
    return getattr(k8s, name, None)


def check_value(value, type_name, where):
    """`value` (from YAML) against a type of the generated client: 'str', 'list[V1Container]',
    'dict(str, str)', 'V1PodSpec', 'object' (int-or-string and free-form fields)."""
    import kubernetes.client as k8s
    if value is None:
        return
    if type_name == "object":
        return
    if type_name in ("str", "datetime", "date"):
        if not isinstance(value, str):
            fail(f"{where}: expected a string, got {type(value).__name__} {value!r}")
        return
    if type_name == "int":
        if isinstance(value, bool) or not isinstance(value, int):
            fail(f"{where}: expected an integer, got {value!r}")
        return
    if type_name == "float":
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            fail(f"{where}: expected a number, got {value!r}")
        return
    if type_name == "bool":
        if not isinstance(value, bool):
            fail(f"{where}: expected true or false, got {value!r}")
        return
    m = re.fullmatch(r"list\[(.+)\]", type_name)
    if m:
        if not isinstance(value, list):
            fail(f"{where}: expected a list, got {type(value).__name__}")
            return
        for i, item in enumerate(value):
            check_value(item, m.group(1), f"{where}[{i}]")
        return
    m = re.fullmatch(r"dict\(str, (.+)\)", type_name)
    if m:
        if not isinstance(value, dict):
            fail(f"{where}: expected a mapping, got {type(value).__name__}")
            return
        for k, v in value.items():
            check_value(v, m.group(1), f"{where}.{k}")
        return
    cls = getattr(k8s, type_name, None)
    if cls is None:
        fail(f"{where}: unknown model type {type_name}")
        return
    check_model(value, cls, where)


def check_model(value, cls, where):
    if not isinstance(value, dict):
        fail(f"{where}: expected an object ({cls.__name__}), got {type(value).__name__}")
        return
    by_json = {json_name: attr for attr, json_name in cls.attribute_map.items()}
    for key, v in value.items():
        attr = by_json.get(key)
        if attr is None:
            fail(f"{where}: unknown field {key!r} in {cls.__name__}")
            continue
        check_value(v, cls.openapi_types[attr], f"{where}.{key}")
    # The model's own constructor knows its required fields (and a few allowed values): give it
    # the scalars as they are and a stand-in for nested values.
    kwargs = {}
    for key, v in value.items():
        attr = by_json.get(key)
        if attr is not None and v is not None:
            kwargs[attr] = v if not isinstance(v, (dict, list)) else {}
    try:
        cls(**kwargs)
    except (ValueError, TypeError) as e:
        fail(f"{where}: {cls.__name__}: {e}")


def check_object(doc, where):
    api_version, kind = doc.get("apiVersion"), doc.get("kind")
    if not isinstance(api_version, str) or not isinstance(kind, str):
        fail(f"{where}: apiVersion and kind are required")
        return
    if api_version.startswith("kustomize.config.k8s.io/"):
        return  # not an API object: kustomize's own file (checked in cross_checks)
    cls = model_class(api_version, kind)
    if cls is None:
        fail(f"{where}: {api_version} {kind} is not a Kubernetes API object the models know")
        return
    check_model(doc, cls, f"{where} ({kind})")
    name = (doc.get("metadata") or {}).get("name", "")
    if not re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", name or "") or len(name) > 63:
        fail(f"{where}: metadata.name {name!r} is not a DNS label")


# --- what the rollout relies on -----------------------------------------------------------------

def find(objects, kind, name=None):
    return [o for o in objects if o.get("kind") == kind and (name is None or
                                                             o["metadata"]["name"] == name)]


def selects(selector, labels):
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def image_user(source):
    text = open(os.path.join(source, "Dockerfile"), encoding="utf-8").read()
    users = re.findall(r"^USER\s+(\S+)", text, re.M)
    return users[-1] if users else None


def check_pod(pod, where, objects, source):
    spec = pod["spec"]
    sc = spec.get("securityContext") or {}
    if sc.get("runAsNonRoot") is not True:
        fail(f"{where}: securityContext.runAsNonRoot must be true")
    user = image_user(source)
    if user and str(sc.get("runAsUser")) != user.split(":")[0]:
        fail(f"{where}: runAsUser {sc.get('runAsUser')} is not the image's USER {user}")
    volumes = {v["name"]: v for v in spec.get("volumes") or []}
    for c in spec["containers"]:
        cw = f"{where}.containers[{c['name']}]"
        for v in c.get("volumeMounts") or []:
            if v["name"] not in volumes:
                fail(f"{cw}: mounts volume {v['name']!r}, which the pod does not define")
        for e in c.get("envFrom") or []:
            ref = (e.get("configMapRef") or {}).get("name")
            if ref and not find(objects, "ConfigMap", ref):
                fail(f"{cw}: envFrom names ConfigMap {ref!r}, which is not in deploy/k8s")
        for e in c.get("env") or []:
            ref = ((e.get("valueFrom") or {}).get("secretKeyRef") or {})
            if ref and not find(objects, "Secret", ref.get("name")):
                fail(f"{cw}: env {e['name']} names Secret {ref.get('name')!r}, not in deploy/k8s")
            elif ref and ref.get("key") not in find(objects, "Secret", ref["name"])[0].get(
                    "stringData", {}):
                fail(f"{cw}: env {e['name']} reads key {ref.get('key')!r} the Secret lacks")
    for name, v in volumes.items():
        if "configMap" in v and not find(objects, "ConfigMap", v["configMap"]["name"]):
            fail(f"{where}: volume {name} names a ConfigMap not in deploy/k8s")
        if "secret" in v and not find(objects, "Secret", v["secret"]["secretName"]):
            fail(f"{where}: volume {name} names a Secret not in deploy/k8s")


def check_replica(dep, objects, source):
    where = "deployment.yaml"
    spec = dep["spec"]
    pod = spec["template"]
    labels = pod["metadata"].get("labels") or {}
    if not selects(spec["selector"].get("matchLabels"), labels):
        fail(f"{where}: spec.selector does not match the pod template's labels")
    check_pod(pod, where, objects, source)
    c = pod["spec"]["containers"][0]
    ports = {p.get("name"): p["containerPort"] for p in c.get("ports") or []}
    for probe, path in (("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")):
        get = (c.get(probe) or {}).get("httpGet")
        if not get:
            fail(f"{where}: {probe} must be an httpGet on {path}")
            continue
        if get.get("path") != path:
            fail(f"{where}: {probe} path {get.get('path')!r}, expected {path}")
        if get.get("port") not in ports and get.get("port") not in ports.values():
            fail(f"{where}: {probe} port {get.get('port')!r} is not a container port")
        if get.get("port") not in ("admin", ports.get("admin")):
            fail(f"{where}: {probe} must use the admin port (server.admin_listen)")
    env = {}
    for e in c.get("envFrom") or []:
        ref = (e.get("configMapRef") or {}).get("name")
        for cm in find(objects, "ConfigMap", ref):
            env.update(cm.get("data") or {})
    env.update({e["name"]: e.get("value") for e in c.get("env") or []})
    admin = env.get("OUTLIVE_SERVER__ADMIN_LISTEN", "")
    if ports.get("admin") is None or not admin.endswith(f":{ports.get('admin')}"):
        fail(f"{where}: OUTLIVE_SERVER__ADMIN_LISTEN {admin!r} is not the admin port "
             f"{ports.get('admin')}")
    # SIGTERM: 1012 to every socket, exit within 10 s (src/app/main.cpp kStopBoundSeconds).
    pre = (((c.get("lifecycle") or {}).get("preStop") or {}).get("exec") or {}).get("command")
    sleep = int(pre[1]) if pre and pre[0] == "sleep" and len(pre) == 2 else None
    if sleep is None or sleep < 1:
        fail(f"{where}: preStop must sleep (the Service drops the pod before SIGTERM)")
    grace = pod["spec"].get("terminationGracePeriodSeconds", 30)
    if sleep is not None and grace < sleep + 15:
        fail(f"{where}: terminationGracePeriodSeconds {grace} < preStop {sleep} s + 15 s of stop")
    file_env = env.get("OUTLIVE_DATABASE_URL_FILE")
    mounts = {m["mountPath"]: m["name"] for m in c.get("volumeMounts") or []}
    volumes = {v["name"]: v for v in pod["spec"].get("volumes") or []}
    mount = next((p for p in mounts if file_env and file_env.startswith(p.rstrip("/") + "/")), None)
    if not mount or "secret" not in volumes.get(mounts[mount], {}):
        fail(f"{where}: OUTLIVE_DATABASE_URL_FILE {file_env!r} is not in a mounted Secret")
    elif os.path.basename(file_env) not in find(objects, "Secret",
                                                 volumes[mounts[mount]]["secret"]["secretName"]
                                                 )[0].get("stringData", {}):
        fail(f"{where}: the Secret has no key {os.path.basename(file_env)!r}")
    if any(k in env for k in ("OUTLIVE_DATABASE_URL", "OUTLIVE_DATABASE")):
        fail(f"{where}: the database URL must come from the Secret file, not the environment")
    args = c.get("args") or []
    config = args[args.index("--config") + 1] if "--config" in args[:-1] else None
    cm_mount = next((p for p in mounts if config and os.path.dirname(config) == p.rstrip("/")),
                    None)
    cm_name = volumes.get(mounts.get(cm_mount), {}).get("configMap", {}).get("name")
    cm = find(objects, "ConfigMap", cm_name) if cm_name else []
    if not cm or os.path.basename(config) not in (cm[0].get("data") or {}):
        fail(f"{where}: --config {config!r} is not a file of a mounted ConfigMap")
        return
    text = cm[0]["data"][os.path.basename(config)]
    try:
        conf = json.loads(text)
    except ValueError as e:
        fail(f"configmap.yaml: {os.path.basename(config)} is not JSON: {e}")
        return
    if "database" in conf or re.search(r"://[^/@\s\"]+:[^/@\s\"]+@", text):
        fail("configmap.yaml: a database URL or a password in a ConfigMap (use the Secret)")
    if "replica" in conf:
        fail("configmap.yaml: `replica` set in the shared file (every pod would claim as one)")
    listen = env.get("OUTLIVE_LISTEN", conf.get("listen", ""))
    if not listen.endswith(f":{ports.get('http')}"):
        fail(f"configmap.yaml: listen {listen!r} is not the container port http {ports.get('http')}")


def cross_checks(objects, files, source):
    deps = find(objects, "Deployment")
    if len(deps) != 1:
        fail(f"expected one Deployment, found {len(deps)}")
        return
    dep = deps[0]
    labels = dep["spec"]["template"]["metadata"].get("labels") or {}
    check_replica(dep, objects, source)
    c = dep["spec"]["template"]["spec"]["containers"][0]
    port_names = {p.get("name") for p in c.get("ports") or []}
    for svc in find(objects, "Service"):
        name = svc["metadata"]["name"]
        if not selects(svc["spec"].get("selector"), labels):
            fail(f"Service {name}: its selector matches no replica")
        for p in svc["spec"].get("ports") or []:
            if isinstance(p.get("targetPort"), str) and p["targetPort"] not in port_names:
                fail(f"Service {name}: targetPort {p['targetPort']!r} is not a container port")
    pdbs = find(objects, "PodDisruptionBudget")
    if not pdbs:
        fail("no PodDisruptionBudget")
    for pdb in pdbs:
        if not selects(pdb["spec"].get("selector", {}).get("matchLabels"), labels):
            fail(f"PodDisruptionBudget {pdb['metadata']['name']}: selects no replica")
    for job in find(objects, "Job"):
        check_pod(job["spec"]["template"], f"Job {job['metadata']['name']}", objects, source)
    kust = [o for o in objects if o.get("kind") == "Kustomization"]
    if kust:
        listed = set(kust[0].get("resources") or [])
        for f in sorted(set(files) - listed - {"kustomization.yaml", "secret.example.yaml"}):
            fail(f"kustomization.yaml: {f} is not among its resources")
        for f in sorted(listed - set(files)):
            fail(f"kustomization.yaml: resource {f} does not exist")
        if "secret.example.yaml" in listed:
            fail("kustomization.yaml: applies the example Secret")


def check_k8s(source, objects=None):
    k8s_dir = os.path.join(source, "deploy", "k8s")
    files = sorted(f for f in os.listdir(k8s_dir) if f.endswith(".yaml"))
    if objects is None:
        objects = []
        for f in files:
            try:
                docs = load_documents(os.path.join(k8s_dir, f))
            except yaml.YAMLError as e:
                fail(f"{f}: {e}")
                continue
            for i, doc in enumerate(docs):
                doc["__file"] = f
                objects.append(doc)
    for doc in objects:
        where = doc.pop("__file", "?")
        check_object(doc, where)
    if not failures:  # the cross-references assume well-formed objects
        cross_checks(objects, files, source)
    return objects


# --- the image ----------------------------------------------------------------------------------

def check_dockerfile(source, text=None):
    if text is None:
        text = open(os.path.join(source, "Dockerfile"), encoding="utf-8").read()
    final = text[text.rfind("\nFROM "):]  # the runtime stage
    joined = re.sub(r"\\\n", " ", final)
    ep = re.findall(r"^ENTRYPOINT\s+(.+)$", joined, re.M)
    if not ep or json.loads(ep[-1]) != ["outlive"]:
        fail('Dockerfile: the runtime stage needs ENTRYPOINT ["outlive"] (exec form)')
    cmd = re.findall(r"^CMD\s+(.+)$", joined, re.M)
    cmd = json.loads(cmd[-1]) if cmd and cmd[-1].startswith("[") else None
    if not cmd or cmd[:2] != ["serve", "--config"] or len(cmd) != 3:
        fail('Dockerfile: CMD must be ["serve", "--config", FILE]')
    users = re.findall(r"^USER\s+(\S+)", joined, re.M)
    if not users or users[-1].split(":")[0] in ("root", "0"):
        fail("Dockerfile: the runtime stage must end as a non-root USER")
    elif not users[-1].split(":")[0].isdigit():
        fail("Dockerfile: USER by number, so runAsNonRoot can verify it")
    hc = re.findall(r"^HEALTHCHECK\s+(.+)$", joined, re.M)
    if not hc or "/healthz" not in (hc[-1] + joined) or "curl" not in hc[-1]:
        fail("Dockerfile: HEALTHCHECK must probe /healthz")
    elif not re.search(r"install[^\n]*\bcurl\b", joined):
        fail("Dockerfile: the HEALTHCHECK uses curl, which the runtime stage does not install")


# --- systemd ------------------------------------------------------------------------------------

MAX_EXPOSURE = 20  # outlive.service measures 1.6 ("OK") on systemd 252


def check_systemd(source, unit_text=None):
    """systemd-analyze verify warns about unknown keys and bad values but exits 0: any line it
    prints about the unit is a failure. ExecStart must exist for verify: a stub takes its place."""
    path = os.path.join(source, "deploy", "systemd", "outlive.service")
    if unit_text is None:
        unit_text = open(path, encoding="utf-8").read()
    exec_start = re.search(r"^ExecStart=(\S+)", unit_text, re.M)
    if not exec_start:
        fail("outlive.service: no ExecStart")
        return
    with tempfile.TemporaryDirectory() as tmp:
        stub = os.path.join(tmp, "outlive")
        with open(stub, "w") as f:
            f.write("#!/bin/sh\nexit 0\n")
        os.chmod(stub, 0o755)
        unit = os.path.join(tmp, "outlive.service")
        with open(unit, "w") as f:
            f.write(unit_text.replace(exec_start.group(1), stub))
        tool = shutil.which("systemd-analyze") or "/usr/bin/systemd-analyze"
        r = subprocess.run([tool, "verify", unit], capture_output=True, text=True, timeout=60)
        lines = [l for l in (r.stdout + r.stderr).splitlines()
                 if "outlive.service" in l or tmp in l]
        for l in lines:
            fail(f"systemd-analyze verify: {l.replace(tmp + '/', '')}")
        if r.returncode != 0 and not lines:
            fail(f"systemd-analyze verify exited {r.returncode}: {r.stderr.strip()}")
        # The hardening as one number (0-100 here, 10x the printed 0.0-10.0 "exposure").
        r = subprocess.run([tool, "security", "--offline=true", f"--threshold={MAX_EXPOSURE}",
                            unit], capture_output=True, text=True, timeout=60)
        if r.returncode != 0:
            last = (r.stdout.strip().splitlines() or ["?"])[-1]
            fail(f"systemd-analyze security: exposure above {MAX_EXPOSURE / 10}: {last}")
    for key in ("NoNewPrivileges=yes", "ProtectSystem=strict", "KillSignal=SIGTERM",
                "RestartPreventExitStatus=2"):
        if not re.search(rf"^{re.escape(key)}$", unit_text, re.M):
            fail(f"outlive.service: {key} is part of its contract")
    stop = re.search(r"^TimeoutStopSec=(\d+)", unit_text, re.M)
    if not stop or int(stop.group(1)) < 15:
        fail("outlive.service: TimeoutStopSec must leave the 10 s stop its time (>= 15)")


# --- each check must catch a mistake ------------------------------------------------------------

def self_test(source):
    global failures
    k8s = check_k8s(source)
    if failures:
        print("the real files fail; fix them first", file=sys.stderr)
        return False
    dep_index = next(i for i, o in enumerate(k8s) if o["kind"] == "Deployment")

    def deployment_mutant(change):
        objects = copy.deepcopy(k8s)
        change(objects[dep_index])
        objects[dep_index]["__file"] = "deployment.yaml"
        return objects

    c0 = lambda d: d["spec"]["template"]["spec"]["containers"][0]  # noqa: E731
    unit = open(os.path.join(source, "deploy/systemd/outlive.service"), encoding="utf-8").read()
    docker = open(os.path.join(source, "Dockerfile"), encoding="utf-8").read()
    cases = {
        "k8s: unknown field": lambda: check_k8s(source, deployment_mutant(
            lambda d: c0(d).update(readinessProbes=c0(d)["readinessProbe"]))),
        "k8s: wrong type": lambda: check_k8s(source, deployment_mutant(
            lambda d: d["spec"].update(replicas="2"))),
        "k8s: required field missing": lambda: check_k8s(source, deployment_mutant(
            lambda d: c0(d).pop("name"))),
        "k8s: selector mismatch": lambda: check_k8s(source, deployment_mutant(
            lambda d: d["spec"]["selector"]["matchLabels"].update(extra="x"))),
        "k8s: liveness on /readyz": lambda: check_k8s(source, deployment_mutant(
            lambda d: c0(d)["livenessProbe"]["httpGet"].update(path="/readyz"))),
        "k8s: grace shorter than the stop": lambda: check_k8s(source, deployment_mutant(
            lambda d: d["spec"]["template"]["spec"].update(terminationGracePeriodSeconds=10))),
        "k8s: probe on an undeclared port": lambda: check_k8s(source, deployment_mutant(
            lambda d: c0(d)["readinessProbe"]["httpGet"].update(port="metrics"))),
        "dockerfile: no entrypoint": lambda: check_dockerfile(
            source, docker.replace('ENTRYPOINT ["outlive"]', "")),
        "dockerfile: root": lambda: check_dockerfile(
            source, re.sub(r"^USER .*$", "USER root", docker, flags=re.M)),
        "systemd: misspelt key": lambda: check_systemd(
            source, unit.replace("RestrictRealtime=yes", "RestrictRealtim=yes")),
        "systemd: bad value": lambda: check_systemd(
            source, unit.replace("Restart=on-failure", "Restart=sometimes")),
        "systemd: hardening removed": lambda: check_systemd(
            source, re.sub(r"^(Protect|Private|Restrict|SystemCall)\w*=.*\n", "", unit, flags=re.M)),
    }
    ok = True
    for name, run in cases.items():
        failures = []
        run()
        caught, failures = failures, []
        print(f"{'caught' if caught else 'MISSED'}: {name}" +
              (f" ({caught[0]})" if caught else ""))
        ok = ok and bool(caught)
    return ok


def main():
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    mode, source = sys.argv[1], sys.argv[2]
    if mode == "self-test":
        return 0 if self_test(source) else 1
    {"k8s": check_k8s, "dockerfile": check_dockerfile, "systemd": check_systemd}[mode](source)
    for f in failures:
        print(f"FAIL {f}")
    print(f"{mode}: {'valid' if not failures else f'{len(failures)} failure(s)'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
