"""deploy/*.yaml, the Kubernetes manifests a user applies as they are: every document parses
and is a Kubernetes object; every slm command line in them (init containers and containers,
with the `$(VAR)` references Kubernetes expands, resolved from the container's env and the
manifests' ConfigMaps) is accepted by slm's own CLI parser, without running anything; the
model reference is pinned by a digest and the same for the pull and the activation; what the
Service, the router and the InferencePool select is the slm pods' template; the ports agree;
the grace periods nest. The checker is itself checked: a planted bad flag, a bad value and an
unknown command are caught."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest
import typer
import yaml

from slm.cli import app

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
_VAR = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


def _documents() -> list[dict]:
    docs = []
    for path in sorted(DEPLOY.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc is not None:
                docs.append(doc)
    return docs


DOCS = _documents()


def _of_kind(kind: str) -> list[dict]:
    return [d for d in DOCS if d["kind"] == kind]


def _config_maps() -> dict[tuple[str, str], dict]:
    return {(d["metadata"]["namespace"], d["metadata"]["name"]): d.get("data", {}) for d in _of_kind("ConfigMap")}


def _containers(deployment: dict) -> list[dict]:
    spec = deployment["spec"]["template"]["spec"]
    return [*spec.get("initContainers", []), *spec.get("containers", [])]


def _argv(container: dict, namespace: str) -> list[str]:
    """command + args with each $(VAR) expanded as the kubelet does, from the container's env
    (a value, or a key of a ConfigMap in these manifests)."""
    env = {}
    for var in container.get("env", []):
        if "value" in var:
            env[var["name"]] = str(var["value"])
        elif "configMapKeyRef" in var["valueFrom"]:  # (a Secret's value is not in the manifests)
            ref = var["valueFrom"]["configMapKeyRef"]
            env[var["name"]] = _config_maps()[(namespace, ref["name"])][ref["key"]]
    words = [*container.get("command", []), *container.get("args", [])]
    return [_VAR.sub(lambda m: env[m.group(1)], str(w)) for w in words]


def slm_lines() -> list[tuple[str, list[str]]]:
    """(container name, its argv after `slm`) for every container that runs slm."""
    lines = []
    for d in _of_kind("Deployment"):
        for c in _containers(d):
            argv = _argv(c, d["metadata"]["namespace"])
            if argv and argv[0] == "slm":
                lines.append((c["name"], argv[1:]))
    return lines


def _click_errors():
    """The exceptions of the click typer builds slm's commands with (recent typer releases
    vendor their own copy of click)."""
    command_class = type(typer.main.get_command(app)).__mro__[1]
    return importlib.import_module(command_class.__module__.rsplit(".", 1)[0] + ".exceptions")


errors = _click_errors()


def parse_slm(argv: list[str]):
    """Parse an slm command line as `slm` would (options, types, the value parsers), down to
    the command it names, without invoking it (a click Context): a bad line raises click's
    UsageError."""
    group = typer.main.get_command(app)
    ctx = group.make_context("slm", list(argv))
    while hasattr(group, "resolve_command"):  # a group: on to the command it names
        rest = [*(getattr(ctx, "_protected_args", None) or getattr(ctx, "protected_args", [])), *ctx.args]
        name, command, rest = group.resolve_command(ctx, rest)
        ctx = command.make_context(name, rest, parent=ctx)
        group = command
    return ctx


def _slm_deployment() -> dict:
    (found,) = [d for d in _of_kind("Deployment")
                if any(_argv(c, "slm")[:2] == ["slm", "serve"] for c in d["spec"]["template"]["spec"]["containers"])]
    return found


def _matches(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def _option(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def test_every_manifest_parses_into_kubernetes_objects():
    files = sorted(DEPLOY.glob("*.yaml"))
    assert len(files) >= 4 and len(DOCS) >= 15
    for doc in DOCS:
        assert isinstance(doc, dict) and doc["apiVersion"] and doc["kind"] and doc["metadata"]["name"], doc
        if doc["kind"] != "Namespace":
            assert doc["metadata"]["namespace"] == "slm", doc["metadata"]
    kinds = {d["kind"] for d in DOCS}
    assert {"Deployment", "Service", "ServiceAccount", "Role", "RoleBinding", "InferencePool"} <= kinds


def test_every_slm_command_line_is_accepted_by_slms_parser():
    lines = slm_lines()
    for name, argv in lines:
        ctx = parse_slm(argv)
        assert ctx.command.name == argv[0], (name, argv)
    assert [argv[0] for _, argv in lines] == ["init", "pull", "activate", "serve"]
    serve = parse_slm(dict(lines)["slm"])
    assert serve.params["host"] == "0.0.0.0" and serve.params["port"] == 8000 and serve.params["grace"] == 20.0


@pytest.mark.parametrize("planted, error", [
    (["--bogus-flag"], errors.NoSuchOption),  # a flag slm does not have
    (["--port", "eighty"], errors.BadParameter),  # a value its parser refuses
    (["--max-batch"], errors.BadOptionUsage),  # a flag missing its value
    (["stray"], errors.UsageError),  # an argument serve does not take
])
def test_the_checker_catches_a_planted_bad_line(planted, error):
    serve = dict(slm_lines())["slm"]
    parse_slm(serve)  # as written: accepted
    with pytest.raises(error):
        parse_slm(serve + planted)
    with pytest.raises(errors.UsageError):  # an unknown command
        parse_slm(["serv", *serve[1:]])


def test_the_model_is_pinned_by_one_digest_for_the_pull_and_the_activation():
    from slm.distribution.reference import parse_reference

    lines = dict(slm_lines())
    pulled, activated = lines["pull"][1], lines["activate"][1]
    assert pulled == activated
    assert parse_reference(pulled).digest is not None  # a tag could move between two pods' starts


def test_the_service_router_and_inference_pool_select_the_slm_pods():
    slm = _slm_deployment()
    labels = slm["spec"]["template"]["metadata"]["labels"]
    for d in _of_kind("Deployment"):  # each Deployment owns its own template
        assert _matches(d["spec"]["selector"]["matchLabels"], d["spec"]["template"]["metadata"]["labels"])
    templates = [d["spec"]["template"]["metadata"]["labels"] for d in _of_kind("Deployment")]
    for service in _of_kind("Service"):  # every Service reaches some pods
        assert any(_matches(service["spec"]["selector"], t) for t in templates), service["metadata"]["name"]
    (slm_service,) = [s for s in _of_kind("Service") if s["metadata"]["name"] == "slm"]
    assert _matches(slm_service["spec"]["selector"], labels)

    (router,) = [d for d in _of_kind("Deployment") if d["metadata"]["name"] == "vllm-router"]
    argv = _argv(router["spec"]["template"]["spec"]["containers"][0], "slm")
    rest = argv[argv.index("--selector") + 1:]  # key=value words up to the next flag
    selector = dict(w.split("=", 1) for w in rest[:next((i for i, w in enumerate(rest) if w.startswith("--")), len(rest))])
    assert _matches(selector, labels)
    assert _option(argv, "--service-discovery-namespace") == slm["metadata"]["namespace"]

    (pool,) = _of_kind("InferencePool")
    assert _matches(pool["spec"]["selector"]["matchLabels"], labels)
    epp = pool["spec"]["endpointPickerRef"]
    (epp_service,) = [s for s in _of_kind("Service") if s["metadata"]["name"] == epp["name"]]
    assert epp["port"]["number"] in [p["port"] for p in epp_service["spec"]["ports"]]


def test_ports_probes_and_grace_periods_agree():
    slm = _slm_deployment()
    pod = slm["spec"]["template"]["spec"]
    (server,) = pod["containers"]
    port = parse_slm(_argv(server, "slm")[1:]).params["port"]
    assert [p["containerPort"] for p in server["ports"]] == [port]
    (router,) = [d for d in _of_kind("Deployment") if d["metadata"]["name"] == "vllm-router"]
    assert int(_option(_argv(router["spec"]["template"]["spec"]["containers"][0], "slm"),
                       "--service-discovery-port")) == port
    (pool,) = _of_kind("InferencePool")
    assert [p["number"] for p in pool["spec"]["targetPorts"]] == [port]
    for probe in ("readinessProbe", "livenessProbe"):
        assert server[probe]["httpGet"]["path"] == "/health"
    # the pod is killed only after the preStop sleep and the drain --grace allows
    grace = parse_slm(_argv(server, "slm")[1:]).params["grace"]
    pre_stop = server["lifecycle"]["preStop"]["sleep"]["seconds"]
    assert pod["terminationGracePeriodSeconds"] > pre_stop + grace
    # liveness does not kill a draining server (/health is 503 through the drain)
    live = server["livenessProbe"]
    assert live["periodSeconds"] * live["failureThreshold"] > grace
    assert server["resources"]["requests"]["cpu"] and server["resources"]["requests"]["memory"]


def test_the_router_command_line_is_accepted_by_vllm_routers_parser():
    launch = pytest.importorskip("vllm_router.launch_router", reason="vllm-router is not installed (dev extra)")
    (router,) = [d for d in _of_kind("Deployment") if d["metadata"]["name"] == "vllm-router"]
    argv = _argv(router["spec"]["template"]["spec"]["containers"][0], "slm")
    assert argv[0] == "vllm-router"
    args = launch.parse_router_args(argv[1:])
    slm_labels = _slm_deployment()["spec"]["template"]["metadata"]["labels"]
    assert args.service_discovery and args.selector == slm_labels
    with pytest.raises(SystemExit):  # its parser refuses what it does not know, too
        launch.parse_router_args([*argv[1:], "--bogus-flag"])
