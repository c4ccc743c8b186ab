"""What an incoming Telegram update means for the gateway. Pure: no I/O, no bot calls.

``classify`` answers one of three things:

* ``Accept(InboundMessage)`` — a message for the bot;
* ``Unsupported`` — a message addressed to the bot that carries nothing readable (a
  sticker, a video note…): the adapter has the gateway answer it with a short note
  instead of leaving the user in silence — if the sender may talk to the bot at all —
  and no turn runs;
* ``Ignore(reason)`` — everything else, logged at debug by the caller.

Rules, in order:

1. **Edits are ignored.** The reply already answers the original text; answering every
   typo fix again would double the replies (and the cost) and could not take back the
   first answer anyway. A user who wants a new answer sends a new message.
2. Private chats always; groups and supergroups only with ``groups_enabled``; channels
   never. Messages from bots (including Telegram's anonymous-admin bot) and automatic
   forwards from a linked channel are not from a person and are ignored.
3. In a group the message must be addressed to the bot: an ``@botname`` mention (or a
   text mention of the bot's user), a ``/command@botname``, or a reply to one of the
   bot's messages. A ``/command@otherbot`` is for another bot, even as a reply to ours.
   In a forum topic every message "replies" to the topic's first message; that is not
   a reply to the bot.
4. The text is the message text or the media caption, with the bot's ``@mention``
   removed. Photos, documents, voice notes and audio are accepted with or without a caption and carry
   their ``file_id`` (the gateway downloads them, ``gateway.media``); other media is
   accepted with a caption (listed as an attachment the model cannot see) and is
   ``Unsupported`` without one; service messages (joins, pins…) are ignored.
5. A reply carries the quoted text: the part the user highlighted (Telegram's quote)
   or else the whole replied-to message.

Ids: ``chat_id`` is the Telegram chat id (negative for groups), ``user_id`` the sender's
id, ``message_id`` the message id (unique in its chat, which is what the inbox keys on),
``thread_id`` the forum topic id.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from telegram import Message, MessageEntity, Update
from telegram.constants import ChatType as TgChatType
from telegram.constants import MessageAttachmentType

from mnemo.gateway.events import Attachment, ChatType, InboundMessage
from mnemo.gateway.media import clean_file_name

UNSUPPORTED_NOTE = "I can't read this kind of message — I read text, photos, files and voice notes."


@dataclass(frozen=True, slots=True)
class BotIdentity:
    id: int
    username: str

    @property
    def handle(self) -> str:
        return "@" + self.username


@dataclass(frozen=True, slots=True)
class Accept:
    message: InboundMessage


@dataclass(frozen=True, slots=True)
class Unsupported:
    """An addressed message with nothing readable in it; answered with a note, by the
    gateway, to people allowed to talk to the bot only. ``message`` describes it: no
    text, its one attachment of the kind that cannot be read."""

    message: InboundMessage

    @property
    def kind(self) -> str:
        return self.message.attachments[0].kind


@dataclass(frozen=True, slots=True)
class Ignore:
    reason: str


Incoming = Accept | Unsupported | Ignore

_GROUPS = frozenset({TgChatType.GROUP, TgChatType.SUPERGROUP})


def classify(update: Update, bot: BotIdentity, *, groups_enabled: bool) -> Incoming:
    if update.edited_message is not None:
        return Ignore("edited message (edits are not answered again)")
    message = update.message
    if message is None:
        return Ignore("not a message")
    chat_type = message.chat.type
    in_group = chat_type in _GROUPS
    if chat_type != TgChatType.PRIVATE and not in_group:
        return Ignore(f"chat type {chat_type}")
    if in_group and not groups_enabled:
        return Ignore("group messages are disabled (telegram.groups_enabled)")
    sender = message.from_user
    if sender is None or sender.is_bot or message.is_automatic_forward:
        return Ignore("not sent by a person")

    body, entities = _body(message)
    replied = _replied_message(message)
    if in_group:
        if _commands_another_bot(entities, bot):
            return Ignore("command for another bot")
        replies_to_bot = (
            replied is not None and replied.from_user is not None and replied.from_user.id == bot.id
        )
        if not (replies_to_bot or _mentions(entities, bot)):
            return Ignore("group message not addressed to the bot")

    thread_id = message.message_thread_id if message.is_topic_message else None
    attachment = _attachment(message)

    def inbound(text: str) -> InboundMessage:
        return InboundMessage(
            platform="telegram",
            chat_id=str(message.chat.id),
            user_id=str(sender.id),
            message_id=str(message.message_id),
            text=text,
            user_name=sender.full_name or sender.username or "",
            chat_type=ChatType.GROUP if in_group else ChatType.DM,
            thread_id=str(thread_id) if thread_id is not None else None,
            mentioned=in_group,
            attachments=(attachment,) if attachment is not None else (),
            reply_to=_quoted(message, replied),
            received_at=message.date,
        )

    if body is None:
        if attachment is None:
            return Ignore("service message")
        if not attachment.ref:
            return Unsupported(inbound(""))
        body = ""  # a photo or file without a caption: the file is the message
    text = strip_mention(body, bot)
    if not text and attachment is None:
        return Ignore("nothing but a mention")
    return Accept(inbound(text))


def strip_mention(text: str, bot: BotIdentity) -> str:
    """``"hey @mnemo_bot, what's up"`` → ``"hey what's up"``; other mentions stay."""
    pattern = rf"[ \t]*(?<![\w@]){re.escape(bot.handle)}\b[,:]?"
    return re.sub(pattern, "", text, flags=re.IGNORECASE).strip()


def _body(message: Message) -> tuple[str | None, dict[MessageEntity, str]]:
    """The readable text (message text or caption) and its entities."""
    if message.text is not None:
        return message.text, message.parse_entities()
    if message.caption is not None:
        return message.caption, message.parse_caption_entities()
    return None, {}


def _mentions(entities: dict[MessageEntity, str], bot: BotIdentity) -> bool:
    handle = bot.handle.lower()
    for entity, text in entities.items():
        if entity.type == MessageEntity.MENTION and text.lower() == handle:
            return True
        if entity.type == MessageEntity.TEXT_MENTION and entity.user is not None and entity.user.id == bot.id:
            return True
        if entity.type == MessageEntity.BOT_COMMAND and entity.offset == 0 and text.lower().endswith(handle):
            return True
    return False


def _commands_another_bot(entities: dict[MessageEntity, str], bot: BotIdentity) -> bool:
    for entity, text in entities.items():
        if entity.type == MessageEntity.BOT_COMMAND and entity.offset == 0 and "@" in text:
            return not text.lower().endswith(bot.handle.lower())
    return False


def _replied_message(message: Message) -> Message | None:
    replied = message.reply_to_message
    if replied is None:
        return None
    # In a forum topic every message points at the topic's first message.
    if message.is_topic_message and replied.message_id == message.message_thread_id:
        return None
    return replied


def _quoted(message: Message, replied: Message | None) -> str | None:
    if replied is None:
        return None
    if message.quote is not None and message.quote.text:
        return message.quote.text
    return replied.text or replied.caption or None


def _attachment(message: Message) -> Attachment | None:
    if message.photo:
        largest = max(message.photo, key=lambda p: p.width * p.height)
        return Attachment(kind="photo", size=largest.file_size, ref=largest.file_id, media_type="image/jpeg")
    if message.document is not None:
        doc = message.document
        return Attachment(
            kind="document",
            name=clean_file_name(doc.file_name or ""),
            size=doc.file_size,
            ref=doc.file_id,
            media_type=doc.mime_type or "",
        )
    if message.voice is not None:
        voice = message.voice
        return Attachment(
            kind="voice",
            name="voice.ogg",
            size=voice.file_size,
            ref=voice.file_id,
            media_type=voice.mime_type or "audio/ogg",
        )
    if message.audio is not None:
        audio = message.audio
        return Attachment(
            kind="audio",
            name=clean_file_name(audio.file_name or "") or "audio",
            size=audio.file_size,
            ref=audio.file_id,
            media_type=audio.mime_type or "",
        )
    for kind in MessageAttachmentType:
        if message[kind.value]:
            document = message.document
            return Attachment(
                kind=kind.value,
                name=clean_file_name(document.file_name or "") if document is not None else "",
            )
    return None
