"""``deploy/docker-compose.postgres.yml`` checked statically (no Docker daemon here):
PostgreSQL, two mnemo replicas with the same configuration and ``MNEMO_DATABASE_URL``,
and a reverse proxy whose configuration sends the Telegram webhook to both in turn."""

from __future__ import annotations

import re
from urllib.parse import urlsplit

import yaml

from mnemo.gateway.config import ENV_KEYS
from tests.gateway.test_deploy import DEPLOY, dockerfile

COMPOSE = DEPLOY / "docker-compose.postgres.yml"
REPLICAS = ("mnemo-1", "mnemo-2")


def compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


def interpolated(value: str, env: dict[str, str]) -> str:
    """Compose's ``${NAME}`` / ``${NAME:?message}`` with ``env``; a missing one fails."""

    def one(m: re.Match[str]) -> str:
        assert m[1] in env, f"{m[1]} is not provided"
        return env[m[1]]

    return re.sub(r"\$\{(\w+)(?::\?[^}]*)?\}", one, value)


def test_the_services_are_postgresql_two_replicas_and_a_proxy() -> None:
    services = compose()["services"]
    assert set(services) == {"postgres", *REPLICAS, "proxy"}
    assert services["postgres"]["image"].startswith("postgres:")
    assert int(services["postgres"]["image"].split(":")[1]) >= 15
    assert "pg_isready" in " ".join(services["postgres"]["healthcheck"]["test"])
    for name in REPLICAS:
        svc = services[name]
        assert svc["depends_on"]["postgres"]["condition"] == "service_healthy"
        assert (
            DEPLOY / svc["build"]["context"] / svc["build"]["dockerfile"]
        ).resolve() == DEPLOY / "Dockerfile"
        assert "postgres" in svc["build"]["args"]["MNEMO_EXTRAS"]
        assert svc["read_only"] is True and "ALL" in svc["cap_drop"]
    # The Dockerfile takes the extras the compose file passes.
    assert ("ARG", 'MNEMO_EXTRAS=""') in dockerfile()
    assert any(w == "RUN" and '".${MNEMO_EXTRAS}"' in rest for w, rest in dockerfile())


def test_the_replicas_share_one_configuration_and_database_and_differ_only_in_identity() -> None:
    services = compose()["services"]
    one, two = (services[n] for n in REPLICAS)
    for key in ("build", "image", "env_file", "depends_on", "networks"):
        assert one[key] == two[key], key
    env1, env2 = dict(one["environment"]), dict(two["environment"])
    assert {env1.pop("MNEMO_REPLICA_ID"), env2.pop("MNEMO_REPLICA_ID")} == set(REPLICAS)
    assert env1 == env2
    assert set(env1) <= set(ENV_KEYS) | {"MNEMO_HOME", "PTB_TIMEDELTA"}
    assert one["volumes"] != two["volumes"], "each replica has its own /data"
    assert all(v.endswith(":/data") for v in one["volumes"] + two["volumes"])
    # The database URL names the postgres service with its user and database.
    pg = services["postgres"]["environment"]
    url = urlsplit(interpolated(env1["MNEMO_DATABASE_URL"], {"POSTGRES_PASSWORD": "pw"}))
    assert url.scheme == "postgresql" and url.hostname == "postgres" and url.port == 5432
    assert url.username == pg["POSTGRES_USER"] and url.path == "/" + pg["POSTGRES_DB"]
    assert url.password == interpolated(pg["POSTGRES_PASSWORD"], {"POSTGRES_PASSWORD": "pw"})
    # Webhook mode, at the URL the proxy serves (never two replicas long-polling one token).
    proxy_env = {"MNEMO_DOMAIN": "bot.example.org", "TELEGRAM_WEBHOOK_PATH": "/telegram/abc"}
    assert interpolated(env1["TELEGRAM_WEBHOOK_URL"], proxy_env) == "https://bot.example.org/telegram/abc"
    assert {k: interpolated(v, proxy_env) for k, v in services["proxy"]["environment"].items()} == proxy_env
    assert "TELEGRAM_WEBHOOK_SECRET" in COMPOSE.read_text()
    # Bound to 0.0.0.0 for the proxy: the web token comes from the env file, which says so.
    assert env1["MNEMO_WEB_HOST"] == "0.0.0.0" and "MNEMO_WEB_TOKEN" in COMPOSE.read_text()
    assert "ports" not in one and "ports" not in two, "only the proxy is published"


def test_the_proxy_sends_the_webhook_round_robin_to_both_replicas() -> None:
    services = compose()["services"]
    proxy = services["proxy"]
    mounts = {m.split(":")[1]: m.split(":")[0] for m in proxy["volumes"]}
    caddyfile = (DEPLOY / mounts["/etc/caddy/Caddyfile"]).resolve()
    assert caddyfile.parent == DEPLOY and caddyfile.is_file()
    text = caddyfile.read_text()
    port = services["mnemo-1"]["environment"]["MNEMO_WEB_PORT"]
    [upstreams] = re.findall(r"^\s*reverse_proxy\s+(.+?)\s*\{", text, re.M)
    assert upstreams.split() == [f"{name}:{port}" for name in REPLICAS]
    assert re.search(r"^\s*lb_policy\s+round_robin\s*$", text, re.M)
    # Only the webhook path is forwarded, and every placeholder is provided to Caddy.
    assert re.search(r"^\s*handle\s+\{\$TELEGRAM_WEBHOOK_PATH\}\s*\{", text, re.M)
    assert set(re.findall(r"\{\$(\w+)\}", text)) <= set(proxy["environment"])
    assert text.count("{") == text.count("}")
    assert sorted(proxy["ports"]) == ["443:443", "80:80"]
    assert set(proxy["depends_on"]) == set(REPLICAS)
