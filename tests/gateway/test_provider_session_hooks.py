"""Session lifecycle reaches the memory providers: session end, compression rollover
(switch) and the pre-compression checkpoint, which is fail-closed for providers that
promise durable capture (checkpoint_version = 2)."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

from tests.gateway.test_housekeeping import SMALL, World, chain, converse, filler, settle
from tests.support.loopback import LoopbackAdapter


def _recording_provider(home: Path, *, fail_checkpoint: bool) -> Path:
    log = home / "hooks.jsonl"
    folder = home / "providers" / "recorder"
    folder.mkdir(parents=True)
    (folder / "provider.py").write_text(
        textwrap.dedent(
            f"""
            import json
            from mnemo.memory.provider import Availability, MemoryProvider, Recall

            LOG = {str(log)!r}

            def note(**event):
                with open(LOG, "a") as f:
                    f.write(json.dumps(event) + "\\n")

            class Recorder(MemoryProvider):
                name = "recorder"
                description = "records lifecycle hooks"
                checkpoint_version = 2

                def is_available(self, home, config):
                    return Availability(True)

                def initialize(self, home, config):
                    pass

                def prefetch(self, query, ctx):
                    return Recall("")

                def get_tool_schemas(self):
                    return []

                def handle_tool_call(self, name, args, ctx):
                    return "{{}}"

                def on_session_end(self, messages, ctx):
                    note(hook="end", session=ctx.session_id, user=str(ctx.user), messages=len(messages))

                def on_session_switch(self, previous_session_id, ctx):
                    note(hook="switch", previous=previous_session_id, session=ctx.session_id)

                def on_pre_compress(self, messages, ctx):
                    note(hook="pre_compress", session=ctx.session_id, messages=len(messages))
                    if {fail_checkpoint!r}:
                        raise RuntimeError("checkpoint store is down")

            PROVIDER = Recorder
            """
        )
    )
    return log


def events(log: Path) -> list[dict]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


async def test_reset_and_rollover_reach_the_provider(app_factory, emulator, home):
    log = _recording_provider(home, fail_checkpoint=False)
    world = World()
    emulator.default = world
    adapter = LoopbackAdapter()
    async with app_factory(adapter, **{**SMALL, "memory.provider": "recorder"}) as app:
        n = await converse(adapter, filler(12))
        await settle(app)
        sessions = await chain(app)
        new = next(s for s in sessions if s.parent_session_id is not None)
        old = next(s for s in sessions if s.id == new.parent_session_id)
        await converse(adapter, ["/reset"], already=n)
        await settle(app)
        (reset,) = [s for s in await chain(app) if s.end_reason == "reset"]
    kinds = [e["hook"] for e in events(log)]
    assert "pre_compress" in kinds and kinds.index("pre_compress") < kinds.index("switch")
    switches = [(e["previous"], e["session"]) for e in events(log) if e["hook"] == "switch"]
    assert (old.id, new.id) in switches
    end = next(e for e in events(log) if e["hook"] == "end")
    assert end["session"] == reset.id and end["user"] == "loop:u1" and end["messages"] > 0


async def test_a_failing_v2_checkpoint_stops_the_compression(app_factory, emulator, home):
    log = _recording_provider(home, fail_checkpoint=True)
    world = World()
    emulator.default = world
    adapter = LoopbackAdapter()
    async with app_factory(adapter, **{**SMALL, "memory.provider": "recorder"}) as app:
        await converse(adapter, filler(12))
        await settle(app)
        assert len(await chain(app)) == 1, "no rollover while the provider cannot checkpoint"
        (job,) = await app.jobs.jobs(kind="compress")
        assert job.state in ("queued", "failed") and "checkpoint" in (job.error or "")
        assert not world.seen["summary"], "the transcript was not summarised"
    assert any(e["hook"] == "pre_compress" for e in events(log))
