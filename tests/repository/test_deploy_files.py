"""The deployment artefacts parse and keep their security properties.

`Dockerfile`, `deploy/kubernetes/` and `deploy/systemd/` are read by tools
this suite cannot run everywhere (a container engine, a cluster, systemd),
so their claims are checked statically: the image runs as a fixed non-root
user with a HEALTHCHECK through `sidecar.probe`; effectd is a native sidecar
with gRPC probes on its health port, a socket on a shared in-memory volume,
data on a claim, tokens from a Secret, and a restricted security context;
the systemd unit carries its hardening. The daemon arguments each of them
passes are resolved by the daemon's own configuration code. Each checker is
also run on a broken copy, which it must reject (the negative control).
"""

from __future__ import annotations

import copy
import hashlib
import json
import shlex
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from sidecar import cli, settings
from sidecar.auth import tokens
from sidecar.config import ServeConfig, is_loopback, split_host_port
from sidecar.policy_file import parse_policy
from tests.support.processes import ROOT

KUBE = ROOT / "deploy" / "kubernetes"
UNIT = ROOT / "deploy" / "systemd" / "effectd.service"
IMAGE_UID = 10001

Instructions = list[tuple[str, str]]
Unit = dict[str, dict[str, list[str]]]


# --- reading the artefacts ---------------------------------------------------


def dockerfile(text: str) -> Instructions:
    """(INSTRUCTION, arguments) pairs; continuations joined, comments dropped."""
    out: Instructions = []
    pending = ""
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        word, _, rest = (pending + stripped).partition(" ")
        out.append((word.upper(), rest.strip()))
        pending = ""
    return out


def image_env(instructions: Instructions) -> dict[str, str]:
    """The final stage's ENV (the run stage is the last FROM)."""
    last_from = max(i for i, (word, _) in enumerate(instructions) if word == "FROM")
    env: dict[str, str] = {}
    for word, rest in instructions[last_from:]:
        if word == "ENV":
            for pair in shlex.split(rest):
                key, _, value = pair.partition("=")
                env[key] = value
    return env


def systemd_unit(text: str) -> Unit:
    """Section → key → values (a key may repeat); continuations joined."""
    unit: Unit = {}
    section: dict[str, list[str]] = {}
    pending = ""
    for line in text.splitlines():
        stripped = line.strip()
        if not pending and (not stripped or stripped.startswith(("#", ";"))):
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        stripped, pending = pending + stripped, ""
        if stripped.startswith("[") and stripped.endswith("]"):
            section = unit.setdefault(stripped[1:-1], {})
            continue
        key, _, value = stripped.partition("=")
        section.setdefault(key.strip(), []).append(value.strip())
    return unit


def kube_documents() -> Iterator[Any]:
    for path in sorted(KUBE.glob("*.yaml")):
        yield from yaml.safe_load_all(path.read_text())


def deployment() -> Any:
    (found,) = [d for d in kube_documents() if d.get("kind") == "Deployment"]
    return found


def flag_value(args: list[str], flag: str) -> str | None:
    for i, arg in enumerate(args):
        if arg.startswith(f"{flag}="):
            return arg.split("=", 1)[1]
        if arg == flag and i + 1 < len(args):
            return args[i + 1]
    return None


def effective(args: list[str], environ: dict[str, str]) -> ServeConfig:
    """The configuration `effectd serve ARGS` resolves in that environment,
    by the daemon's own settings code (an unknown flag fails here)."""
    return settings.load(cli.parser().parse_args(["serve", *args]), environ).config


def container_config(c: Any) -> ServeConfig:
    """A container's effective daemon configuration: the image's environment,
    then the container's, then its arguments."""
    env = image_env(dockerfile((ROOT / "Dockerfile").read_text()))
    env.update({e["name"]: e["value"] for e in c.get("env", []) if "value" in e})
    return effective(c.get("args", []), env)


def under(path: str, mount: str) -> bool:
    return path == mount or path.startswith(mount.rstrip("/") + "/")


# --- the checkers: each returns what is wrong --------------------------------


def dockerfile_problems(instructions: Instructions) -> list[str]:
    found = []
    words = [w for w, _ in instructions]
    if ("ARG", "BASE=python:3.11-slim") not in instructions or words.index(
        "ARG"
    ) > words.index("FROM"):
        found.append("no ARG BASE=python:3.11-slim before the first FROM")
    froms = [rest for w, rest in instructions if w == "FROM"]
    if len(froms) < 2 or any(not f.startswith("${BASE}") for f in froms):
        found.append(f"not a multi-stage build on ${{BASE}}: {froms}")
    users = [rest for w, rest in instructions if w == "USER"]
    if not users or users[-1] != f"{IMAGE_UID}:{IMAGE_UID}":
        found.append(f"the final USER is not {IMAGE_UID}:{IMAGE_UID}: {users}")
    checks = [rest for w, rest in instructions if w == "HEALTHCHECK"]
    command = checks[-1].partition("CMD")[2].strip() if checks else ""
    try:
        probe = json.loads(command)
    except json.JSONDecodeError:
        probe = None
    if not isinstance(probe, list) or probe[1:3] != ["-m", "sidecar.probe"]:
        found.append(f"HEALTHCHECK is not the exec-form probe: {checks}")
    expected = {
        "ENTRYPOINT": '["effectd", "serve"]',
        "STOPSIGNAL": "SIGTERM",
        "VOLUME": "/var/lib/effectd",
    }
    for word, rest in expected.items():
        if (word, rest) not in instructions:
            found.append(f"no {word} {rest}")
    env = image_env(instructions)
    wanted_env = {
        "EFFECTD_DATA_DIR": "/var/lib/effectd",
        "EFFECTD_SOCKET": "/run/effectd/effectd.sock",
    }
    for key, value in wanted_env.items():
        if env.get(key) != value:
            found.append(f"ENV {key} is {env.get(key)!r}, not {value!r}")
    if "EFFECTD_INIT" in env:
        found.append(
            "ENV EFFECTD_INIT: any volume without a ledger would get a new one"
        )
    health = env.get("EFFECTD_HEALTH_LISTEN")
    exposed = [rest for w, rest in instructions if w == "EXPOSE"]
    if health is None or [str(split_host_port("h", health)[1])] != exposed:
        found.append(f"EXPOSE {exposed} is not the health port of {health!r}")
    return found


RESTRICTED = {
    "runAsNonRoot": True,
    "allowPrivilegeEscalation": False,
    "readOnlyRootFilesystem": True,
    "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}


def _container_problems(c: Any) -> list[str]:
    found = []
    context = c.get("securityContext", {})
    for key, value in RESTRICTED.items():
        if context.get(key) != value:
            found.append(f"{c['name']}: securityContext.{key} is {context.get(key)}")
    resources = c.get("resources", {})
    if not resources.get("requests") or "memory" not in resources.get("limits", {}):
        found.append(f"{c['name']}: no resource requests and memory limit")
    return found


def _sidecar_problems(pod: Any, effectd: Any) -> list[str]:
    found = []
    if effectd.get("restartPolicy") != "Always":
        found.append("effectd is not a native sidecar (restartPolicy Always)")
    config = container_config(effectd)
    health = config.health_listen
    port = split_host_port("health-listen", health)[1] if health else None
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        if effectd.get(probe, {}).get("grpc", {}).get("port") != port:
            found.append(f"effectd: {probe} is not gRPC on the health port {port}")
    ports = [p.get("containerPort") for p in effectd.get("ports", [])]
    if port not in ports:
        found.append(f"effectd: the health port {port} is not declared")
    if not pod.get("terminationGracePeriodSeconds", 30) > config.grace_seconds:
        found.append("terminationGracePeriodSeconds is not longer than --grace")
    return found


def _volume_problems(pod: Any, effectd: Any, agent: Any) -> list[str]:
    found = []
    volumes = {v["name"]: v for v in pod.get("volumes", [])}

    def mounts(c: Any) -> list[Any]:
        return list(c.get("volumeMounts", []))

    def mount_of(c: Any, path: str) -> Any:
        for m in mounts(c):
            if under(path, m["mountPath"]):
                return volumes.get(m["name"], {})
        return {}

    config = container_config(effectd)
    sock = str(config.socket_path)
    shared = mount_of(effectd, sock)
    if shared.get("emptyDir", {}).get("medium") != "Memory":
        found.append(f"the socket {sock!r} is not on an in-memory emptyDir")
    if mount_of(agent, sock) is not shared or not shared:
        found.append("the agent does not mount the socket's volume")
    data = mount_of(effectd, str(config.data_dir))
    claims = {
        d["metadata"]["name"]
        for d in kube_documents()
        if d.get("kind") == "PersistentVolumeClaim"
    }
    if data.get("persistentVolumeClaim", {}).get("claimName") not in claims:
        found.append("the data directory is not on the PersistentVolumeClaim")
    secrets = [v for v in volumes.values() if "secret" in v]
    if not secrets or any(v["secret"].get("defaultMode") != 0o400 for v in secrets):
        found.append("the tokens Secret is not mounted with defaultMode 0400")
    if not mount_of(effectd, str(config.tokens_file or "/")):
        found.append("--tokens-file is not on a mounted volume")
    roots = {m["mountPath"].rstrip("/") for m in mounts(effectd)}
    # Directories the daemon makes itself, 0700: a volume's root is group-
    # or world-writable, and the daemon refuses (data) or warns (socket).
    for directory in (str(config.socket_path.parent), str(config.data_dir)):
        if directory in roots:
            found.append(f"{directory} is a volume's root")
    return found


def kube_problems(deploy: Any) -> list[str]:
    pod = deploy["spec"]["template"]["spec"]
    found = []
    context = pod.get("securityContext", {})
    if context.get("runAsNonRoot") is not True or context.get("runAsUser") in (
        None,
        0,
    ):
        found.append(f"the pod may run as root: {context}")
    inits = {c["name"]: c for c in pod.get("initContainers", [])}
    mains = {c["name"]: c for c in pod.get("containers", [])}
    for c in [*inits.values(), *mains.values()]:
        found += _container_problems(c)
    effectd, agent = inits.get("effectd"), mains.get("agent")
    if effectd is None or agent is None:
        return [*found, "no effectd init container or no agent container"]
    found += _sidecar_problems(pod, effectd)
    found += _volume_problems(pod, effectd, agent)
    if not container_config(effectd).init:
        found.append("effectd: no --init, and the claim is empty at the first start")
    return found


# A filesystem keeps part of its blocks for itself (ext4: metadata, and 5%
# for root): the map must fit in what the daemon's user can write.
VOLUME_SHARE_FOR_THE_MAP = 0.9
_QUANTITY_UNITS = {
    "Ki": 1 << 10,
    "Mi": 1 << 20,
    "Gi": 1 << 30,
    "Ti": 1 << 40,
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
}


def quantity(text: str) -> int:
    """Bytes of a Kubernetes quantity (`2Gi`, `500M`, `1024`)."""
    for suffix, unit in _QUANTITY_UNITS.items():
        if text.endswith(suffix):
            return int(float(text.removesuffix(suffix)) * unit)
    return int(text)


def map_problems(deploy: Any, claims: list[Any]) -> list[str]:
    """The LMDB map of the effectd container must fit in the claim its data
    directory is on: otherwise writes fail with STORAGE_FULL when the disk
    fills, while the store looks far from full."""
    pod = deploy["spec"]["template"]["spec"]
    effectd = _effectd(pod)
    config = container_config(effectd)
    mounts = [
        m
        for m in effectd.get("volumeMounts", [])
        if under(str(config.data_dir), m["mountPath"])
    ]
    if not mounts:
        return [f"the data directory {config.data_dir} is on no volume"]
    mount = max(mounts, key=lambda m: len(m["mountPath"]))
    volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
    claim_name = volume.get("persistentVolumeClaim", {}).get("claimName")
    sized = [c for c in claims if claim_name and c["metadata"]["name"] == claim_name]
    if not sized:
        return [f"the data directory is on {mount['name']}, not on a claim"]
    size = quantity(sized[0]["spec"]["resources"]["requests"]["storage"])
    if config.map_size > size * VOLUME_SHARE_FOR_THE_MAP:
        return [
            f"--map-size {config.map_size} does not fit in "
            f"{VOLUME_SHARE_FOR_THE_MAP:.0%} of the {size}-byte claim {claim_name}"
        ]
    return []


def claims() -> list[Any]:
    return [d for d in kube_documents() if d.get("kind") == "PersistentVolumeClaim"]


HARDENING = {
    # Ready once the socket serves, not once the process runs (sd_notify).
    "Type": "notify",
    "NoNewPrivileges": "yes",
    "ProtectSystem": "strict",
    "ProtectHome": "yes",
    "PrivateTmp": "yes",
    "RuntimeDirectory": "effectd",
    "RuntimeDirectoryMode": "0700",
    "UMask": "0077",
    "CapabilityBoundingSet": "",
    "RestrictAddressFamilies": "AF_UNIX AF_INET AF_INET6",
    "KillSignal": "SIGTERM",
    "ExecReload": "/bin/kill -HUP $MAINPID",
}


def unit_problems(unit: Unit) -> list[str]:
    service = unit.get("Service", {})
    found = []
    for key, value in HARDENING.items():
        if service.get(key, [None])[-1] != value:
            found.append(f"{key}={service.get(key)}, not {value!r}")
    if "effectd" not in " ".join(service.get("StateDirectory", [])).split():
        found.append("no StateDirectory=effectd")
    if "@system-service" not in service.get("SystemCallFilter", []):
        found.append("SystemCallFilter does not allow only @system-service")
    user = service.get("User", ["root"])[-1]
    if service.get("DynamicUser", ["no"])[-1] != "yes" and user in ("root", "0"):
        found.append("runs as root")
    if not service.get("ReadWritePaths"):
        found.append("ReadWritePaths is not limited")
    args = shlex.split(service.get("ExecStart", [""])[-1])[1:]
    if "--init" in args or "--init=true" in args:
        found.append("ExecStart has --init: a lost state directory would start empty")
    grace = float(flag_value(args, "--grace") or 5)
    if not float(service.get("TimeoutStopSec", ["0"])[-1]) > grace:
        found.append("TimeoutStopSec is not longer than --grace")
    return found


# --- the tests ---------------------------------------------------------------


def test_dockerfile_builds_a_non_root_image_with_a_grpc_healthcheck() -> None:
    """ARG BASE, multi-stage, USER 10001, HEALTHCHECK via sidecar.probe."""
    assert dockerfile_problems(dockerfile((ROOT / "Dockerfile").read_text())) == []


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("USER 10001:10001", "USER root"),
        ('"-m", "sidecar.probe"', '"-c", "print()"'),
        ("ARG BASE=python:3.11-slim", "ARG BASE=python:3.12"),
        ("EXPOSE 50052", "EXPOSE 8080"),
        ("STOPSIGNAL SIGTERM", "STOPSIGNAL SIGKILL"),
        ("PYTHONUNBUFFERED=1 \\", "PYTHONUNBUFFERED=1 EFFECTD_INIT=true \\"),
    ],
)
def test_negative_control_a_broken_dockerfile_is_caught(old: str, new: str) -> None:
    text = (ROOT / "Dockerfile").read_text()
    assert old in text
    assert dockerfile_problems(dockerfile(text.replace(old, new))) != []


def test_dockerignore_keeps_local_state_out_of_the_build() -> None:
    """No venv, node_modules, data directory, caches or git history."""
    ignored = (ROOT / ".dockerignore").read_text().split()
    for entry in (".git", ".venv", "**/node_modules", ".effectd", "**/__pycache__"):
        assert entry in ignored


def test_kubernetes_manifests_parse_and_kustomize_lists_them() -> None:
    """Every YAML parses; the kustomization names files that exist."""
    docs = list(kube_documents())
    assert {d["kind"] for d in docs} >= {"Deployment", "PersistentVolumeClaim"}
    kustomization = yaml.safe_load((KUBE / "kustomization.yaml").read_text())
    for name in kustomization["resources"]:
        assert (KUBE / name).is_file()
    for generator in kustomization.get("configMapGenerator", []):
        for name in generator["files"]:
            assert (KUBE / name.split("=")[-1]).is_file()


def test_effectd_is_a_restricted_native_sidecar() -> None:
    """Native sidecar, gRPC probes on the health port, shared in-memory
    socket volume, data on the claim, tokens from a 0400 Secret, every
    container restricted."""
    assert kube_problems(deployment()) == []


def _break(deploy: Any, change: Callable[[Any], None]) -> Any:
    broken = copy.deepcopy(deploy)
    change(broken["spec"]["template"]["spec"])
    return broken


def _effectd(pod: Any) -> Any:
    return next(c for c in pod["initContainers"] if c["name"] == "effectd")


@pytest.mark.parametrize(
    "change",
    [
        lambda pod: _effectd(pod).pop("restartPolicy"),
        lambda pod: _effectd(pod)["readinessProbe"].update(grpc={"port": 1}),
        lambda pod: _effectd(pod)["securityContext"].update(
            readOnlyRootFilesystem=False
        ),
        lambda pod: pod["containers"][0]["securityContext"]["capabilities"].update(
            drop=[]
        ),
        lambda pod: pod["securityContext"].update(runAsUser=0),
        lambda pod: pod.update(terminationGracePeriodSeconds=5),
        lambda pod: pod["volumes"][1].update(emptyDir={}),
        lambda pod: pod["containers"][0].update(volumeMounts=[]),
        lambda pod: pod["volumes"][3]["secret"].update(defaultMode=0o644),
        lambda pod: _effectd(pod)["env"][0].update(value="/var/lib/effectd"),
        lambda pod: _effectd(pod)["env"][1].update(value="/run/effectd/x.sock"),
        lambda pod: _effectd(pod)["env"][1].update(value="/var/run/other/x.sock"),
        lambda pod: _effectd(pod)["args"].remove("--init"),
    ],
    ids=[
        "not-native",
        "probe-port",
        "writable-root",
        "capabilities",
        "root",
        "grace",
        "disk-socket",
        "no-shared-socket",
        "secret-mode",
        "data-in-volume-root",
        "socket-in-volume-root",
        "socket-not-shared",
        "no-init",
    ],
)
def test_negative_control_a_weakened_deployment_is_caught(
    change: Callable[[Any], None],
) -> None:
    assert kube_problems(_break(deployment(), change)) != []


def test_the_ledgers_map_fits_in_its_volume() -> None:
    """The map size the Kubernetes daemon runs with fits in the claim its
    data directory is on (issue 25 item 9: fails before the fix: the
    default 8GiB map on a 2Gi claim)."""
    assert map_problems(deployment(), claims()) == []


def _without_map_size(deploy: Any) -> Any:
    def drop(pod: Any) -> None:
        effectd = _effectd(pod)
        effectd["args"] = [a for a in effectd["args"] if not a.startswith("--map-size")]

    return _break(deploy, drop)


def _shrunk(found: list[Any]) -> list[Any]:
    smaller = copy.deepcopy(found)
    for claim in smaller:
        claim["spec"]["resources"]["requests"]["storage"] = "1Gi"
    return smaller


@pytest.mark.parametrize(
    ("deploy", "volumes"),
    [
        (lambda: _without_map_size(deployment()), claims),
        (deployment, lambda: _shrunk(claims())),
    ],
    ids=["default-map", "smaller-claim"],
)
def test_negative_control_a_map_larger_than_its_volume_is_caught(
    deploy: Callable[[], Any], volumes: Callable[[], list[Any]]
) -> None:
    assert map_problems(deploy(), volumes()) != []


def test_the_daemon_accepts_the_arguments_every_artefact_passes() -> None:
    """The flags and variables in the manifests, the unit and the image are
    the daemon's, and valid together: a renamed flag or setting fails here,
    not in production."""
    image = image_env(dockerfile((ROOT / "Dockerfile").read_text()))
    alone = effective([], image)
    alone.validate()
    assert alone.data_dir == Path("/var/lib/effectd")
    assert alone.socket_path == Path("/run/effectd/effectd.sock")
    assert alone.health_listen == "0.0.0.0:50052"

    sidecar = container_config(_effectd(deployment()["spec"]["template"]["spec"]))
    sidecar.validate()
    assert sidecar.tokens_file is not None
    assert sidecar.socket_path == Path("/run/effectd/sock/effectd.sock")

    exec_start = systemd_unit(UNIT.read_text())["Service"]["ExecStart"][-1]
    unit_args = shlex.split(exec_start)[2:]
    specifiers = {"%S": "/var/lib", "%t": "/run"}
    for spec, value in specifiers.items():
        unit_args = [a.replace(spec, value) for a in unit_args]
    unit = effective(unit_args, {})
    unit.validate()
    assert unit.socket_path == Path("/run/effectd/effectd.sock")
    assert unit.tokens_file == Path("/etc/effectd/tokens.toml")


def test_the_example_tokens_and_policy_are_valid() -> None:
    """tokens.example.toml, with its placeholders filled, is a tokens file
    the daemon loads; policy.toml is a policy it accepts."""
    text = (KUBE / "tokens.example.toml").read_text()
    for n, placeholder in enumerate(
        sorted({w.strip('"') for w in text.split() if w.startswith('"replace-')})
    ):
        digest = hashlib.sha256(f"example-token-{n}".encode()).hexdigest()
        text = text.replace(placeholder, digest)
    assert len(tokens.parse(text, path="tokens.example.toml")) == 2
    parse_policy((KUBE / "policy.toml").read_text(), "policy.toml")


def test_systemd_unit_is_hardened() -> None:
    """The unit's sandboxing keys are there, with their values."""
    assert unit_problems(systemd_unit(UNIT.read_text())) == []


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("ProtectSystem=strict", "ProtectSystem=full"),
        ("NoNewPrivileges=yes", "NoNewPrivileges=no"),
        ("CapabilityBoundingSet=\n", "CapabilityBoundingSet=CAP_NET_ADMIN\n"),
        ("User=effectd", "User=root"),
        ("TimeoutStopSec=30", "TimeoutStopSec=5"),
        ("UMask=0077", "UMask=0022"),
        ("serve \\\n", "serve --init \\\n"),
        ("Type=notify", "Type=exec"),
    ],
)
def test_negative_control_a_weakened_unit_is_caught(old: str, new: str) -> None:
    text = UNIT.read_text()
    assert old in text
    assert unit_problems(systemd_unit(text.replace(old, new))) != []


@pytest.mark.skipif(
    shutil.which("systemd-analyze") is None, reason="needs systemd-analyze"
)
def test_systemd_accepts_the_unit(tmp_path: Path) -> None:
    """systemd's own parser finds nothing wrong (ExecStart pointed at an
    executable that exists here)."""
    unit = tmp_path / "effectd.service"
    unit.write_text(UNIT.read_text().replace("/opt/effectd/bin/effectd", "/bin/true"))
    done = subprocess.run(
        ["systemd-analyze", "verify", str(unit)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr


# --- metrics for an in-cluster Prometheus ------------------------------------


def selects(selector: Any, labels: dict[str, str]) -> bool:
    wanted = (selector or {}).get("matchLabels", {})
    return bool(wanted) and all(labels.get(k) == v for k, v in wanted.items())


def metrics_problems(
    deploy: Any, documents: list[Any], config: ServeConfig
) -> list[str]:
    """effectd's metrics on the pod's network, on a declared port named
    `metrics`; a NetworkPolicy that selects the pod lets only named peers
    reach that port and opens no other; the example PodMonitor scrapes it."""
    template = deploy["spec"]["template"]
    labels = template["metadata"]["labels"]
    effectd = _effectd(template["spec"])
    found = []
    listen = config.metrics_listen
    host, port = split_host_port("m", listen) if listen else ("", 0)
    if not listen or is_loopback(host):
        found.append(f"metrics not on the pod's network: {listen!r}")
    declared = {p.get("name"): p.get("containerPort") for p in effectd.get("ports", [])}
    if declared.get("metrics") != port:
        found.append(f"no port named metrics for {port}: {declared}")
    policies = [
        d
        for d in documents
        if d.get("kind") == "NetworkPolicy"
        and selects(d["spec"]["podSelector"], labels)
    ]
    if not policies:
        found.append("no NetworkPolicy selects the pod")
    for policy in policies:
        if "Ingress" not in policy["spec"].get("policyTypes", []):
            found.append(f"{policy['metadata']['name']}: does not isolate ingress")
        for rule in policy["spec"].get("ingress", []):
            if not rule.get("from") or not rule.get("ports"):
                found.append(
                    f"{policy['metadata']['name']}: a rule open to all: {rule}"
                )
            elif any(p.get("port") not in ("metrics", port) for p in rule["ports"]):
                found.append(f"{policy['metadata']['name']}: another port: {rule}")
    return found


def podmonitor_problems(monitor: Any, deploy: Any) -> list[str]:
    labels = deploy["spec"]["template"]["metadata"]["labels"]
    found = []
    if not selects(monitor["spec"].get("selector"), labels):
        found.append("the PodMonitor does not select the agent pods")
    endpoints = monitor["spec"].get("podMetricsEndpoints", [])
    if [(e.get("port"), e.get("path")) for e in endpoints] != [("metrics", "/metrics")]:
        found.append(f"the PodMonitor does not scrape metrics at /metrics: {endpoints}")
    return found


def podmonitor() -> Any:
    return yaml.safe_load((KUBE / "podmonitor.example.yaml").read_text())


def test_prometheus_in_the_cluster_can_scrape_the_metrics_and_no_one_else() -> None:
    """Both manifests: effectd's metrics on the pod's network, a port named
    metrics, a NetworkPolicy that opens only that port and only to named
    peers, and a PodMonitor example that scrapes it (issue 25 item 16:
    fails before the fix: metrics listened on loopback only)."""
    single = deployment()
    config = container_config(_effectd(single["spec"]["template"]["spec"]))
    assert metrics_problems(single, list(kube_documents()), config) == []
    shared = shared_deployment()
    config = shared_config(_effectd(shared["spec"]["template"]["spec"]))
    assert metrics_problems(shared, shared_documents(), config) == []
    for deploy in (single, shared):
        assert podmonitor_problems(podmonitor(), deploy) == []
    for directory in (KUBE, SHARED):
        kustomization = yaml.safe_load((directory / "kustomization.yaml").read_text())
        assert "networkpolicy.yaml" in kustomization["resources"]
        assert "podmonitor.example.yaml" not in kustomization["resources"]


def _policy(documents: list[Any]) -> Any:
    return next(d for d in documents if d.get("kind") == "NetworkPolicy")


@pytest.mark.parametrize(
    "change",
    [
        lambda d, docs: _effectd(d["spec"]["template"]["spec"])["args"].append(
            "--metrics-listen=127.0.0.1:9464"
        ),
        lambda d, docs: _effectd(d["spec"]["template"]["spec"])["ports"].pop(),
        lambda d, docs: _policy(docs)["spec"]["ingress"][0].pop("from"),
        lambda d, docs: _policy(docs)["spec"]["ingress"].append(
            {"from": [{"podSelector": {}}]}
        ),
        lambda d, docs: _policy(docs)["spec"]["ingress"][0]["ports"].append(
            {"port": 50051}
        ),
        lambda d, docs: _policy(docs)["spec"].update(policyTypes=["Egress"]),
        lambda d, docs: _policy(docs)["spec"].update(
            podSelector={"matchLabels": {"app.kubernetes.io/name": "other"}}
        ),
    ],
    ids=[
        "loopback",
        "no-port",
        "open-to-all",
        "every-port",
        "grpc-port",
        "no-isolation",
        "another-pod",
    ],
)
def test_negative_control_exposed_or_unreachable_metrics_are_caught(
    change: Callable[[Any, list[Any]], None],
) -> None:
    deploy = copy.deepcopy(deployment())
    documents = copy.deepcopy(list(kube_documents()))
    change(deploy, documents)
    config = container_config(_effectd(deploy["spec"]["template"]["spec"]))
    assert metrics_problems(deploy, documents, config) != []


def test_negative_control_a_podmonitor_that_misses_is_caught() -> None:
    monitor = podmonitor()
    monitor["spec"]["podMetricsEndpoints"][0]["port"] = "health"
    assert podmonitor_problems(monitor, deployment()) != []
    monitor = podmonitor()
    monitor["spec"]["selector"] = {"matchLabels": {"app": "x"}}
    assert podmonitor_problems(monitor, deployment()) != []


# --- many agent pods sharing one PostgreSQL database -------------------------

SHARED = KUBE / "shared-postgres"
MIGRATE = SHARED / "migrate"
# What the kubelet would put in place of a Secret's value: a URL with a
# password, so that a leak of it into the manifest's text can be seen.
SECRET_URL = "postgresql://effectd:s3cret-pw@db.example:5432/ledger"
SAMPLE_POD = {"metadata.name": "agent-5d9c7-x2x4q", "metadata.namespace": "team-a"}
# A URL or password written out in a manifest, not read from a Secret.
INLINE_SECRET_MARKS = ("postgresql://", "postgres://", "password=", "sslpassword")


def shared_documents(directory: Path = SHARED) -> list[Any]:
    return [
        doc
        for path in sorted(directory.glob("*.yaml"))
        if path.name != "kustomization.yaml"
        for doc in yaml.safe_load_all(path.read_text())
    ]


def shared_deployment() -> Any:
    (found,) = [d for d in shared_documents() if d.get("kind") == "Deployment"]
    return found


def migration_job() -> Any:
    (found,) = [d for d in shared_documents(MIGRATE) if d.get("kind") == "Job"]
    return found


def kubelet_env(c: Any, pod: dict[str, str] = SAMPLE_POD) -> dict[str, str]:
    """A container's environment as the kubelet makes it: the downward API's
    fields from `pod`, a Secret's value as `SECRET_URL` (or a marker), and
    `$(NAME)` replaced by an earlier variable's value."""
    env: dict[str, str] = {}
    for e in c.get("env", []):
        source = e.get("valueFrom") or {}
        if "value" in e:
            value = str(e["value"])
            for name, known in env.items():
                value = value.replace(f"$({name})", known)
        elif "fieldRef" in source:
            value = pod[source["fieldRef"]["fieldPath"]]
        elif "secretKeyRef" in source:
            ref = source["secretKeyRef"]
            value = SECRET_URL if ref["key"] == "url" else f"<{ref['name']}>"
        else:
            value = ""
        env[e["name"]] = value
    return env


def shared_config(effectd: Any, pod: dict[str, str] = SAMPLE_POD) -> ServeConfig:
    env = image_env(dockerfile((ROOT / "Dockerfile").read_text()))
    env.update(kubelet_env(effectd, pod))
    return effective(effectd.get("args", []), env)


def _store_from_secret(c: Any) -> list[str]:
    """EFFECTD_STORE read from a Secret, and no URL or password written
    anywhere in the container (its env values, arguments or command)."""
    found = []
    env = {e["name"]: e for e in c.get("env", [])}
    ref = (env.get("EFFECTD_STORE", {}).get("valueFrom") or {}).get("secretKeyRef")
    if not ref or not ref.get("name") or not ref.get("key"):
        found.append(f"{c['name']}: EFFECTD_STORE is not from a Secret")
    written = [str(e.get("value", "")) for e in env.values()]
    written += [str(a) for a in [*c.get("args", []), *c.get("command", [])]]
    for text in written:
        if any(mark in text.lower() for mark in INLINE_SECRET_MARKS):
            found.append(f"{c['name']}: a URL or password inline: {text!r}")
        if text == "--store" or text.startswith("--store="):
            found.append(f"{c['name']}: the store in the arguments: {text!r}")
    return found


def _daemon_id_problems(effectd: Any) -> list[str]:
    """The daemon id the daemon resolves (its flags over its environment)
    comes from the pod's name and namespace (the downward API): distinct for
    two pods, the same across a restart of one."""
    pods = [
        SAMPLE_POD,
        {**SAMPLE_POD, "metadata.name": "agent-5d9c7-k8w2m"},
        {**SAMPLE_POD, "metadata.namespace": "team-b"},
    ]
    ids = [shared_config(effectd, pod).daemon_id for pod in pods]
    if None in ids or "" in ids:
        return ["effectd: no daemon id set"]
    if len(set(ids)) != len(ids):
        return [f"effectd: the daemon id is not the pod's own: {ids}"]
    if any("$(" in str(i) for i in ids):
        return [f"effectd: the daemon id refers to an unknown variable: {ids}"]
    return []


def shared_problems(deploy: Any) -> list[str]:
    """The hardening of the single-pod manifest, less its volume claim, plus
    the shared store's: the URL from a Secret, a daemon id per pod, no disk."""
    pod = deploy["spec"]["template"]["spec"]
    found = []
    context = pod.get("securityContext", {})
    if context.get("runAsNonRoot") is not True or context.get("runAsUser") in (
        None,
        0,
    ):
        found.append(f"the pod may run as root: {context}")
    inits = {c["name"]: c for c in pod.get("initContainers", [])}
    mains = {c["name"]: c for c in pod.get("containers", [])}
    for c in [*inits.values(), *mains.values()]:
        found += _container_problems(c)
    effectd, agent = inits.get("effectd"), mains.get("agent")
    if effectd is None or agent is None:
        return [*found, "no effectd init container or no agent container"]
    found += _sidecar_problems(pod, effectd)
    found += _store_from_secret(effectd)
    found += _daemon_id_problems(effectd)
    config = shared_config(effectd)
    if config.store != SECRET_URL:
        found.append("the daemon does not serve the store of the Secret")
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    if any("persistentVolumeClaim" in v for v in volumes.values()):
        found.append("a volume claim: the ledger is in the database")
    by_name = {
        m["mountPath"]: volumes.get(m["name"], {}) for m in agent["volumeMounts"]
    }
    sock = str(config.socket_path)
    shared = [
        v
        for m in effectd.get("volumeMounts", [])
        if under(sock, m["mountPath"])
        for v in [volumes.get(m["name"], {})]
    ]
    if not shared or shared[0].get("emptyDir", {}).get("medium") != "Memory":
        found.append(f"the socket {sock!r} is not on an in-memory emptyDir")
    elif not any(under(sock, p) and v is shared[0] for p, v in by_name.items()):
        found.append("the agent does not mount the socket's volume")
    roots = {m["mountPath"].rstrip("/") for m in effectd.get("volumeMounts", [])}
    for directory in (str(config.socket_path.parent), str(config.data_dir)):
        if directory in roots:
            found.append(f"{directory} is a volume's root")
    secrets = [v for v in volumes.values() if "secret" in v]
    if any(v["secret"].get("defaultMode") != 0o400 for v in secrets):
        found.append("a Secret is not mounted with defaultMode 0400")
    return found


def job_problems(job: Any) -> list[str]:
    """The migration runs `effectd migrate` on the Secret's URL, restricted."""
    pod = job["spec"]["template"]["spec"]
    found = []
    context = pod.get("securityContext", {})
    if context.get("runAsNonRoot") is not True or context.get("runAsUser") in (
        None,
        0,
    ):
        found.append(f"the pod may run as root: {context}")
    if pod.get("restartPolicy") not in ("Never", "OnFailure"):
        found.append(f"restartPolicy {pod.get('restartPolicy')}")
    if "backoffLimit" not in job["spec"]:
        found.append("no backoffLimit: a broken migration is retried 6 times")
    (c,) = pod["containers"]
    found += _container_problems(c)
    found += _store_from_secret(c)
    command = c.get("command", [])
    if command[:1] != ["effectd"]:
        found.append(f"not an effectd command: {command}")
    else:
        try:
            args = cli.parser().parse_args([*command[1:], *c.get("args", [])])
        except SystemExit:
            args = None
        if args is None or args.command != "migrate":
            found.append(f"not `effectd migrate`: {command}")
    return found


def test_the_shared_store_manifests_parse_and_kustomize_lists_them() -> None:
    """Both kustomizations name files that exist; the pods and the Job are
    there."""
    for directory in (SHARED, MIGRATE):
        kustomization = yaml.safe_load((directory / "kustomization.yaml").read_text())
        for name in kustomization["resources"]:
            assert (directory / name).is_file()
        for generator in kustomization.get("configMapGenerator", []):
            for name in generator["files"]:
                assert (directory / name.split("=")[-1]).is_file()
    assert shared_deployment()["spec"]["replicas"] > 1
    assert migration_job()["kind"] == "Job"


def test_many_pods_share_the_database_each_daemon_under_its_own_id() -> None:
    """Native sidecars hardened as the single-pod manifest's, the database's
    URL from a Secret and nowhere inline, the daemon id from the downward
    API, the socket on a shared in-memory volume, no volume claim."""
    assert shared_problems(shared_deployment()) == []


def test_the_shared_daemon_configuration_is_valid_and_masks_the_url() -> None:
    """The daemon resolves the manifest's environment and arguments into a
    valid configuration on the Secret's URL, under the pod's daemon id, and
    prints that URL with its password masked."""
    effectd = _effectd(shared_deployment()["spec"]["template"]["spec"])
    config = shared_config(effectd)
    config.validate()
    assert config.store == SECRET_URL
    assert config.daemon_id == "team-a/agent-5d9c7-x2x4q"
    assert config.registration_ttl_seconds > 0
    assert config.socket_path == Path("/run/effectd/sock/effectd.sock")
    env = image_env(dockerfile((ROOT / "Dockerfile").read_text()))
    env.update(kubelet_env(effectd))
    parsed = cli.parser().parse_args(["serve", *effectd["args"]])
    printed = settings.render(settings.load(parsed, env))
    assert "s3cret-pw" not in printed
    assert "db.example" in printed


def test_the_migration_job_runs_effectd_migrate_on_the_secret() -> None:
    assert job_problems(migration_job()) == []


def test_the_shared_policy_is_valid() -> None:
    parse_policy((SHARED / "policy.toml").read_text(), "policy.toml")


def _inline(entry: Any) -> None:
    entry.pop("valueFrom")
    entry["value"] = SECRET_URL


def _env_entry(pod: Any, name: str) -> Any:
    return next(e for e in _effectd(pod)["env"] if e["name"] == name)


@pytest.mark.parametrize(
    "change",
    [
        lambda pod: _inline(_env_entry(pod, "EFFECTD_STORE")),
        lambda pod: _env_entry(pod, "EFFECTD_STORE").pop("valueFrom"),
        lambda pod: _effectd(pod)["args"].append("--store=" + SECRET_URL),
        lambda pod: _effectd(pod)["args"].append("--daemon-id=agent"),
        lambda pod: _env_entry(pod, "EFFECTD_DAEMON_ID").update(value="agent"),
        lambda pod: _env_entry(pod, "EFFECTD_DAEMON_ID").update(
            value="$(POD_NAMESPACE)"
        ),
        lambda pod: _env_entry(pod, "EFFECTD_DAEMON_ID").update(value="$(HOSTNAME)"),
        lambda pod: pod["volumes"].append(
            {"name": "data", "persistentVolumeClaim": {"claimName": "effectd-data"}}
        ),
        lambda pod: _effectd(pod).pop("restartPolicy"),
        lambda pod: _effectd(pod)["livenessProbe"].update(grpc={"port": 1}),
        lambda pod: _effectd(pod)["securityContext"].update(
            allowPrivilegeEscalation=True
        ),
        lambda pod: pod["containers"][0]["securityContext"].update(
            readOnlyRootFilesystem=False
        ),
        lambda pod: pod["securityContext"].update(runAsNonRoot=False),
        lambda pod: pod.update(terminationGracePeriodSeconds=10),
        lambda pod: pod["volumes"][0].update(emptyDir={}),
        lambda pod: pod["containers"][0].update(volumeMounts=[]),
        lambda pod: pod["volumes"][2]["secret"].update(defaultMode=0o644),
        lambda pod: _env_entry(pod, "EFFECTD_DATA_DIR").update(value="/run/effectd"),
    ],
    ids=[
        "url-inline",
        "url-missing",
        "url-in-args",
        "fixed-id-flag",
        "fixed-id",
        "id-namespace-only",
        "id-unknown-variable",
        "volume-claim",
        "not-native",
        "probe-port",
        "privilege-escalation",
        "agent-writable-root",
        "root",
        "grace",
        "disk-socket",
        "no-shared-socket",
        "secret-mode",
        "socket-in-volume-root",
    ],
)
def test_negative_control_a_weakened_shared_deployment_is_caught(
    change: Callable[[Any], None],
) -> None:
    assert shared_problems(_break(shared_deployment(), change)) != []


def _job_container(job: Any) -> Any:
    return job["spec"]["template"]["spec"]["containers"][0]


@pytest.mark.parametrize(
    "change",
    [
        lambda job: _job_container(job).update(command=["effectd", "serve"]),
        lambda job: _job_container(job).pop("command"),
        lambda job: _job_container(job).update(
            env=[{"name": "EFFECTD_STORE", "value": SECRET_URL}]
        ),
        lambda job: _job_container(job).update(
            command=["effectd", "migrate", "--store", SECRET_URL]
        ),
        lambda job: _job_container(job)["securityContext"]["capabilities"].update(
            drop=[]
        ),
        lambda job: job["spec"]["template"]["spec"]["securityContext"].update(
            runAsUser=0
        ),
        lambda job: job["spec"]["template"]["spec"].update(restartPolicy="Always"),
        lambda job: job["spec"].pop("backoffLimit"),
    ],
    ids=[
        "serve",
        "entrypoint",
        "url-inline",
        "url-in-command",
        "capabilities",
        "root",
        "restart-always",
        "no-backoff-limit",
    ],
)
def test_negative_control_a_weakened_migration_job_is_caught(
    change: Callable[[Any], None],
) -> None:
    broken = copy.deepcopy(migration_job())
    change(broken)
    assert job_problems(broken) != []
