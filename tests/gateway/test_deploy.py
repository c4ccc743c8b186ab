"""The deployment files, checked statically (no Docker daemon or systemd in CI): the
Dockerfile's instructions, the compose file's structure and the systemd unit's
hardening, each against what mnemo itself expects (env names, paths, /healthz)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import yaml

from mnemo.gateway.config import ENV_KEYS

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"

DOCKER_INSTRUCTIONS = {
    "FROM", "RUN", "CMD", "LABEL", "EXPOSE", "ENV", "ADD", "COPY", "ENTRYPOINT", "VOLUME",
    "USER", "WORKDIR", "ARG", "ONBUILD", "STOPSIGNAL", "HEALTHCHECK", "SHELL",
}  # fmt: skip


def dockerfile() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with comments dropped and continuations joined."""
    logical, current = [], ""
    for raw in (DEPLOY / "Dockerfile").read_text().splitlines():
        line = raw.strip()
        if not current and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):
            continue  # a comment inside a continued instruction
        if line.endswith("\\"):
            current += line[:-1] + " "
            continue
        logical.append(current + line)
        current = ""
    assert not current, "the Dockerfile ends inside a continued line"
    out = []
    for line in logical:
        word, _, rest = line.partition(" ")
        assert word.upper() == word and word in DOCKER_INSTRUCTIONS, f"unknown instruction: {line[:40]}"
        out.append((word, rest.strip()))
    return out


def env_of(instructions: list[tuple[str, str]]) -> dict[str, str]:
    env = {}
    for word, rest in instructions:
        if word == "ENV":
            for pair in shlex.split(rest):
                key, _, value = pair.partition("=")
                env[key] = value
    return env


def test_dockerfile_runs_as_non_root_with_the_home_in_a_volume_and_a_healthcheck() -> None:
    ins = dockerfile()
    words = [w for w, _ in ins]
    assert ins[0] == ("FROM", "python:3.11-slim")
    env = env_of(ins)
    assert env["MNEMO_HOME"] == "/data"
    assert set(k for k in env if k.startswith("MNEMO_")) <= set(ENV_KEYS) | {"MNEMO_HOME"}
    [user] = [rest for w, rest in ins if w == "USER"]
    assert user.split(":")[0] not in ("root", "0")
    assert words.index("USER") > max(i for i, w in enumerate(words) if w == "RUN"), (
        "nothing runs as root after USER"
    )
    [volume] = [rest for w, rest in ins if w == "VOLUME"]
    assert "/data" in volume
    [expose] = [rest for w, rest in ins if w == "EXPOSE"]
    assert expose == env["MNEMO_WEB_PORT"]
    [health] = [rest for w, rest in ins if w == "HEALTHCHECK"]
    assert "/healthz" in health and "127.0.0.1" in health and "--timeout=" in health
    assert ("ENTRYPOINT", '["mnemo"]') in ins and ("CMD", '["run"]') in ins
    # Every COPY source exists in the build context (the repository root).
    for word, rest in ins:
        if word == "COPY":
            *sources, _ = rest.split()
            for src in sources:
                assert (REPO / src).exists(), src
    # The image copies mnemo/ and every folder its symlinks point to (gateway/, ...).
    copied = {rest.split()[0] for w, rest in ins if w == "COPY"}
    linked = {p.readlink().name for p in (REPO / "mnemo").iterdir() if p.is_symlink()}
    assert linked == {"gateway", "adapters", "memory", "providers"}
    assert linked | {"mnemo", "pyproject.toml"} <= copied


def test_compose_builds_the_image_keeps_state_in_a_volume_and_publishes_on_loopback() -> None:
    doc = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())
    svc = doc["services"]["mnemo"]
    assert (DEPLOY / svc["build"]["context"] / svc["build"]["dockerfile"]).resolve() == DEPLOY / "Dockerfile"
    assert "mnemo-data:/data" in svc["volumes"] and "mnemo-data" in doc["volumes"]
    env = svc["environment"]
    assert env["MNEMO_HOME"] == "/data"
    assert set(env) <= set(ENV_KEYS) | {"MNEMO_HOME", "PTB_TIMEDELTA"}
    for mapping in svc["ports"]:
        assert mapping.startswith("127.0.0.1:"), "published on the host's loopback only"
    # Bound to 0.0.0.0 inside the container: the token must come from the env file,
    # and the file says so.
    assert env["MNEMO_WEB_HOST"] == "0.0.0.0"
    assert svc["env_file"] and "MNEMO_WEB_TOKEN" in (DEPLOY / "docker-compose.yml").read_text()
    assert svc["read_only"] is True and "ALL" in svc["cap_drop"]
    assert "no-new-privileges:true" in svc["security_opt"]


def systemd_unit(path: Path) -> dict[str, dict[str, list[str]]]:
    """Sections of key -> values (systemd keys may repeat, e.g. Environment=)."""
    sections: dict[str, dict[str, list[str]]] = {}
    current: dict[str, list[str]] | None = None
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        header = re.fullmatch(r"\[(\w+)\]", line)
        if header:
            current = sections.setdefault(header[1], {})
            continue
        key, sep, value = line.partition("=")
        assert current is not None and sep and re.fullmatch(r"[A-Za-z]+", key), f"not a unit line: {line}"
        current.setdefault(key, []).append(value)
    return sections


def test_the_systemd_unit_runs_a_dedicated_user_hardened_and_restarts_on_failure() -> None:
    unit = systemd_unit(DEPLOY / "mnemo.service")
    svc = {k: v[-1] for k, v in unit["Service"].items()}
    assert svc["User"] not in ("root", "0") and svc["Group"] not in ("root", "0")
    assert svc["Restart"] == "on-failure"
    assert svc["RestartPreventExitStatus"] == "2", "a config error (exit 2) must not restart-loop"
    assert svc["NoNewPrivileges"] == "yes" and svc["ProtectSystem"] == "strict"
    assert svc["ProtectHome"] == "yes" and svc["PrivateTmp"] == "yes"
    assert svc["CapabilityBoundingSet"] == ""
    env = dict(v.split("=", 1) for v in unit["Service"]["Environment"])
    assert set(env) <= set(ENV_KEYS) | {"MNEMO_HOME", "PTB_TIMEDELTA"}
    home = env["MNEMO_HOME"]
    assert home in svc["ReadWritePaths"].split()
    assert home == "/var/lib/" + svc["StateDirectory"] and svc["StateDirectoryMode"] == "0700"
    assert svc["EnvironmentFile"].lstrip("-").startswith("/etc/")
    assert svc["ExecStart"].endswith("/mnemo run")
    assert svc["KillSignal"] == "SIGTERM"
    assert unit["Install"]["WantedBy"] == ["multi-user.target"]
