"""compose.yaml, the Dockerfile and .env.example, checked without a Docker engine.

compose.yaml is validated against the Compose Specification's JSON schema (the copy that
docker-compose 1.29.2 ships, downloaded from the package registry by this test), then read
for what the schema cannot say: healthy dependencies, replicas, lock settings, and that
every variable it uses is documented in .env.example.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib
import zipfile
from typing import Any

import jsonschema
import pytest
import yaml

from tests.conftest import ROOT

COMPOSE = ROOT / "compose.yaml"
DOCKERFILE = ROOT / "Dockerfile"
ENV_EXAMPLE = ROOT / ".env.example"


@pytest.fixture(scope="session")
def compose_schema(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    folder = tmp_path_factory.mktemp("compose-schema")
    result = subprocess.run(
        [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--dest", str(folder),
         "docker-compose==1.29.2"],
        capture_output=True, text=True, timeout=300, check=False,
    )
    wheels = list(folder.glob("docker_compose-*.whl"))
    assert wheels, f"could not download the Compose schema's package:\n{result.stderr[-2000:]}"
    with zipfile.ZipFile(wheels[0]) as wheel:
        schema: dict[str, Any] = json.loads(wheel.read("compose/config/compose_spec.json"))
    return schema


@pytest.fixture(scope="session")
def compose() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))
    return loaded


def test_compose_yaml_follows_the_compose_specification(compose: dict[str, Any], compose_schema: dict[str, Any]):
    jsonschema.validate(compose, compose_schema, cls=jsonschema.Draft7Validator)
    # The schema is not a rubber stamp: a misspelt key is refused.
    broken = {**compose, "services": {**compose["services"], "web": {**compose["services"]["web"], "comand": "x"}}}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(broken, compose_schema, cls=jsonschema.Draft7Validator)


def test_every_service_starts_after_healthy_dependencies(compose: dict[str, Any]):
    services = compose["services"]
    assert {"postgres", "broker", "lock-1", "lock-2", "lock-3", "web", "worker", "beat", "flower"} <= set(services)
    for name, service in services.items():
        for dependency, condition in (service.get("depends_on") or {}).items():
            assert dependency in services, f"{name} depends on an unknown service {dependency}"
            assert condition == {"condition": "service_healthy"}, f"{name} -> {dependency}: {condition}"
            assert "healthcheck" in services[dependency], f"{dependency} has no healthcheck for {name} to wait on"


def test_two_workers_two_beats_three_lock_masters_and_an_optional_flower(compose: dict[str, Any]):
    services = compose["services"]
    assert services["worker"]["deploy"]["replicas"] == 2
    assert services["beat"]["deploy"]["replicas"] == 2
    assert "cron_celery.beat.Scheduler" in services["beat"]["command"]
    for index in (1, 2, 3):
        command = services[f"lock-{index}"]["command"]
        assert command[command.index("--maxmemory-policy") + 1] == "noeviction"
        assert command[command.index("--appendonly") + 1] == "yes"
    masters = services["worker"]["environment"]["CRON_LOCK_MASTERS"].split(",")
    assert masters == [f"redis://lock-{index}:6379/0" for index in (1, 2, 3)]
    assert services["flower"]["profiles"] == ["flower"]
    assert "migrate" in " ".join(services["web"]["command"]) and "sync_cron_schedules" in " ".join(
        services["web"]["command"])


def test_every_variable_is_documented_in_env_example(compose: dict[str, Any]):
    used = set(re.findall(r"\$\{(\w+)", COMPOSE.read_text(encoding="utf-8")))
    documented = {line.split("=", 1)[0] for line in ENV_EXAMPLE.read_text(encoding="utf-8").splitlines()
                  if line and not line.startswith("#")}
    assert used <= documented, used - documented
    settings_text = (ROOT / "example/proj/settings.py").read_text(encoding="utf-8")
    read_by_settings = {name for pair in re.findall(r"os\.environ\.get\(\"(\w+)\"|os\.environ\[\"(\w+)\"\]",
                                                       settings_text) for name in pair if name}
    given_by_compose = set(compose["x-app"]["environment"])
    given_by_image = set(re.findall(r"\b([A-Z_]+)=", DOCKERFILE.read_text(encoding="utf-8")))
    missing = read_by_settings - documented - given_by_compose - given_by_image
    assert not missing, f"read by example/proj/settings.py but not in .env.example: {sorted(missing)}"


def test_the_dockerfile_builds_a_slim_non_root_image_of_this_checkout():
    lines = [line.strip() for line in DOCKERFILE.read_text(encoding="utf-8").splitlines()
             if line.strip() and not line.startswith("#")]
    assert re.fullmatch(r"FROM python:3\.1[2-9]-slim", lines[0]), lines[0]
    instructions = [line.split()[0] for line in lines if not line.startswith(("&&", "PYTHON", "PIP", "STATIC"))]
    assert instructions.index("USER") > max(i for i, word in enumerate(instructions) if word == "RUN"), \
        "the image must drop to its own user after installing"
    user = next(line.split()[1] for line in lines if line.startswith("USER "))
    assert user not in ("root", "0") and "useradd" in " ".join(lines)
    installs = [found for line in lines if line.startswith("RUN pip install")
                for found in re.findall(r'"\.\[([^\]]*)\]"', line)]
    assert len(installs) == 1, "the image installs this checkout once, with its extras"
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["optional-dependencies"]
    asked = {extra.strip() for extra in installs[0].split(",")}
    assert asked == {"prometheus", "sentry"} and asked <= set(declared), (asked, sorted(declared))
    for line in lines:
        if line.startswith("COPY "):
            for source in line.split()[1:-1]:
                assert (ROOT / source).exists(), f"COPY of a missing path: {source}"
    assert "EXPOSE 8000" in lines and lines[-1].startswith("CMD [")
    wsgi = ROOT / "example/proj/wsgi.py"
    assert wsgi.exists() and "proj.wsgi:application" in lines[-1]
