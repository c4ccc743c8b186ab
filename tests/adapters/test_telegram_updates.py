"""What an incoming Telegram update means: the rules of ``adapters.telegram_updates``,
on updates shaped like the Bot API's (built by the fake server's world)."""

from __future__ import annotations

import string
from typing import Any

from hypothesis import given
from hypothesis import strategies as st
from telegram import Update

from mnemo.adapters.telegram_updates import Accept, BotIdentity, Ignore, Unsupported, classify, strip_mention
from mnemo.gateway.events import ChatType
from tests.fakes.telegram_world import TelegramWorld, detect_entities

BOT = BotIdentity(4242, "mnemo_bot")
GROUP = -1001
USER = 77


def world() -> TelegramWorld:
    return TelegramWorld(BOT.id, BOT.username, "Mnemo")


def update(message: dict[str, Any], kind: str = "message") -> Update:
    result = Update.de_json({"update_id": 1, kind: message}, None)
    assert result is not None
    return result


def text_message(w: TelegramWorld, chat_id: int, text: str, **kwargs: Any) -> dict[str, Any]:
    entities = detect_entities(text)
    extra = {"entities": entities} if entities else {}
    return w.user_message(chat_id, USER, text=text, **extra, **kwargs)


def bot_message(w: TelegramWorld, chat_id: int, text: str) -> dict[str, Any]:
    chat = w.add_chat(chat_id, chat_type="supergroup" if chat_id < 0 else "private")
    return w.store_message(chat, w.bot_user, None, None, {"text": text})


def accepted(u: Update, groups: bool = True) -> Any:
    verdict = classify(u, BOT, groups_enabled=groups)
    assert isinstance(verdict, Accept), verdict
    return verdict.message


def test_a_private_text_becomes_a_dm_message() -> None:
    w = world()
    msg = accepted(update(text_message(w, USER, "hello there", first_name="Ada")), groups=False)
    assert (msg.platform, msg.chat_id, msg.user_id, msg.chat_type, msg.text) == (
        "telegram",
        str(USER),
        str(USER),
        ChatType.DM,
        "hello there",
    )
    assert msg.user_name == "Ada" and msg.thread_id is None and msg.reply_to is None


def test_group_messages_need_a_mention_a_command_for_this_bot_or_a_reply_to_it() -> None:
    w = world()
    kw = {"chat_type": "supergroup"}
    ours = bot_message(w, GROUP, "an earlier answer")
    chatter = update(text_message(w, GROUP, "talking among us", **kw))
    assert classify(chatter, BOT, groups_enabled=True) == Ignore("group message not addressed to the bot")
    assert accepted(update(text_message(w, GROUP, "hey @MNEMO_BOT, help", **kw))).text == "hey help"
    assert accepted(update(text_message(w, GROUP, "/status@mnemo_bot", **kw))).text == "/status@mnemo_bot"
    reply = accepted(update(text_message(w, GROUP, "and then?", reply_to=ours["message_id"], **kw)))
    assert (reply.text, reply.reply_to, reply.chat_type) == ("and then?", "an earlier answer", ChatType.GROUP)
    other = update(text_message(w, GROUP, "/status@other_bot", reply_to=ours["message_id"], **kw))
    assert classify(other, BOT, groups_enabled=True) == Ignore("command for another bot")
    disabled = classify(update(text_message(w, GROUP, "@mnemo_bot hi", **kw)), BOT, groups_enabled=False)
    assert isinstance(disabled, Ignore) and "disabled" in disabled.reason


def test_a_text_mention_of_the_bot_user_addresses_it() -> None:
    w = world()
    entity = {"type": "text_mention", "offset": 0, "length": 5, "user": dict(w.bot_user)}
    u = update(w.user_message(GROUP, USER, chat_type="group", text="Mnemo, what now?", entities=[entity]))
    assert accepted(u).text == "Mnemo, what now?"


def test_a_forum_topic_is_a_thread_and_its_first_message_is_not_a_reply() -> None:
    w = world()
    topic_start = bot_message(w, GROUP, "topic created")  # the bot opened the topic
    kw = {"chat_type": "supergroup", "message_thread_id": topic_start["message_id"], "is_topic_message": True}
    # Every topic message "replies" to the topic's first message (id == thread id).
    u = update(text_message(w, GROUP, "plain talk in the topic", reply_to=topic_start["message_id"], **kw))
    assert classify(u, BOT, groups_enabled=True) == Ignore("group message not addressed to the bot")
    mention = accepted(update(text_message(w, GROUP, "@mnemo_bot in topic", **kw)))
    assert (mention.thread_id, mention.text) == (str(topic_start["message_id"]), "in topic")


def test_media_without_text_is_unsupported_and_captions_are_text() -> None:
    w = world()
    note = {"file_id": "v", "file_unique_id": "uv", "duration": 2, "length": 240}
    video_note = w.user_message(USER, USER, video_note=note)
    unsupported = classify(update(video_note), BOT, groups_enabled=False)
    assert isinstance(unsupported, Unsupported) and unsupported.kind == "video_note"
    described = unsupported.message  # what the gateway authorizes before the note is sent
    assert (described.chat_id, described.user_id, described.message_id, described.text) == (
        str(USER),
        str(USER),
        str(video_note["message_id"]),
        "",
    )
    assert [(a.kind, a.ref) for a in described.attachments] == [("video_note", "")]
    voice = accepted(update(w.user_message(USER, USER, voice={**note, "mime_type": "audio/ogg"})))
    assert [(a.kind, a.ref, a.media_type) for a in voice.attachments] == [("voice", "v", "audio/ogg")]
    assert voice.text == ""
    doc = {"file_id": "d", "file_unique_id": "ud", "file_name": "notes.pdf"}
    msg = accepted(update(w.user_message(USER, USER, document=doc, caption="summarise this")))
    assert msg.text == "summarise this" and [(a.kind, a.name) for a in msg.attachments] == [
        ("document", "notes.pdf")
    ]
    unaddressed = update(w.user_message(GROUP, USER, chat_type="supergroup", video_note=note))
    assert isinstance(classify(unaddressed, BOT, groups_enabled=True), Ignore)


def test_edits_bots_channels_and_service_messages_are_ignored() -> None:
    w = world()
    original = text_message(w, USER, "helo")
    edited = w.set_text(USER, original["message_id"], "hello", None)
    assert isinstance(classify(update(edited, "edited_message"), BOT, groups_enabled=True), Ignore)
    from_bot = w.user_message(USER, USER, text="beep")
    from_bot["from"]["is_bot"] = True
    assert classify(update(from_bot), BOT, groups_enabled=True) == Ignore("not sent by a person")
    channel = w.user_message(-2002, USER, chat_type="channel", text="news")
    assert isinstance(classify(update(channel), BOT, groups_enabled=True), Ignore)
    joined = w.user_message(USER, USER, new_chat_members=[{"id": 5, "is_bot": False, "first_name": "N"}])
    assert classify(update(joined), BOT, groups_enabled=True) == Ignore("service message")
    only_mention = text_message(w, GROUP, "@mnemo_bot", chat_type="supergroup")
    assert classify(update(only_mention), BOT, groups_enabled=True) == Ignore("nothing but a mention")


def test_a_quote_of_part_of_the_replied_message_is_what_is_quoted() -> None:
    w = world()
    ours = bot_message(w, USER, "first line\nsecond line")
    message = text_message(w, USER, "why this?", reply_to=ours["message_id"])
    message["quote"] = {"text": "second line", "position": 11}
    assert accepted(update(message)).reply_to == "second line"


_WORDS = st.lists(
    st.text(alphabet=string.ascii_letters + string.digits + ".,!?'-", min_size=1, max_size=8), max_size=8
)


@given(_WORDS, st.data())
def test_strip_mention_removes_the_bots_handle_and_keeps_every_other_word(
    words: list[str], data: st.DataObject
) -> None:
    tokens = list(words)
    for position in sorted(
        data.draw(st.lists(st.integers(0, len(words)), min_size=1, max_size=3)), reverse=True
    ):
        tokens.insert(position, data.draw(st.sampled_from(["@mnemo_bot", "@Mnemo_Bot,", "@MNEMO_BOT:"])))
    assert strip_mention(" ".join(tokens), BOT).split() == words


def test_strip_mention_leaves_other_handles_alone() -> None:
    assert strip_mention("ask @mnemo_bots_friend or @mnemo_bot: now", BOT) == "ask @mnemo_bots_friend or now"
    assert strip_mention("mail me at a@mnemo_bot.org", BOT) == "mail me at a@mnemo_bot.org"
