"""session_search with the auxiliary-model digest wired in (search.digest: true)."""

from mnemo.gateway.emulator import Reply, ToolUse
from tests.support.loopback import LoopbackAdapter


async def test_digest_from_the_aux_model_replaces_raw_snippets(app_factory, emulator):
    emulator.script(
        Reply(text="Lisbon sounds lovely."),
        Reply(tool_uses=[ToolUse("session_search", {"query": "Lisbon"})]),
        Reply(text="- On that day the user said they plan to visit Lisbon in May."),  # the digest call
        Reply(text="You told me about Lisbon."),
    )
    adapter = LoopbackAdapter()
    async with app_factory(adapter, **{"search.digest": True}) as app:
        await adapter.say("I plan to visit Lisbon in May")
        await adapter.wait_sent(1)
        await adapter.say("/reset")
        await adapter.wait_sent(2)
        await adapter.say("what did I say about my trip?")
        await adapter.wait_sent(3)
    digest_req = emulator.requests[2]
    assert digest_req.body["model"] == app.settings.llm.aux_model
    assert "Lisbon" in digest_req.body["messages"][0]["content"]
    result_block = emulator.requests[3].body["messages"][-1]["content"][0]
    assert result_block["type"] == "tool_result"
    text = result_block["content"]  # the text the model reads
    assert "visit Lisbon in May" in text
    assert "summarised" in text


async def test_digest_failure_falls_back_to_plain_hits(app_factory, emulator):
    from mnemo.gateway.emulator import Fault

    emulator.script(
        Reply(text="ok"),
        Reply(tool_uses=[ToolUse("session_search", {"query": "zebra"})]),
        Fault(
            status=400, body={"type": "error", "error": {"type": "invalid_request_error", "message": "nope"}}
        ),
        Reply(text="found it"),
    )
    adapter = LoopbackAdapter()
    async with app_factory(adapter, **{"search.digest": True}):
        await adapter.say("the zebra escaped")
        await adapter.wait_sent(1)
        await adapter.say("/reset")
        await adapter.wait_sent(2)
        await adapter.say("remind me about the animal")
        await adapter.wait_sent(3)
    assert adapter.texts()[-1] == "found it"
    result_block = emulator.requests[-1].body["messages"][-1]["content"][0]
    assert "zebra escaped" in result_block["content"]
