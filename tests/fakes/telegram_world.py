"""What the fake Telegram knows: the bot, chats, messages, files and callback queries,
and the JSON shapes the Bot API gives them. No I/O here; ``telegram_api`` serves it.

Message ids come from one global counter, so they grow inside every chat as Telegram's
do (Telegram numbers them per chat; tests only rely on them growing).
"""

from __future__ import annotations

import io
import re
import secrets
import time
from collections.abc import Mapping
from typing import Any

from mnemo.adapters.splitting import utf16_len

_MENTION = re.compile(r"(?<![\w@])@[A-Za-z0-9_]{3,32}\b")
_BOT_COMMAND = re.compile(r"^/[A-Za-z0-9_]{1,32}(?:@[A-Za-z0-9_]+)?")


def jpeg(width: int = 64, height: int = 48, color: tuple[int, int, int] = (200, 80, 40)) -> bytes:
    """A real JPEG of the given size (what a phone would upload, only smaller)."""
    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (width, height), color).save(out, "JPEG")
    return out.getvalue()


_FAKE_JPEG = jpeg()


class TelegramWorld:
    def __init__(self, bot_id: int, bot_username: str, bot_name: str) -> None:
        self.bot_user: dict[str, Any] = {
            "id": bot_id,
            "is_bot": True,
            "first_name": bot_name,
            "username": bot_username,
        }
        self.chats: dict[int, dict[str, Any]] = {}
        self.messages: dict[tuple[int, int], dict[str, Any]] = {}
        self.callback_queries: set[str] = set()
        self._files: dict[str, tuple[str, bytes]] = {}  # file_id -> (file_path, content)
        self._next_message_id = 1

    def add_chat(
        self,
        chat_id: int,
        *,
        chat_type: str = "private",
        title: str | None = None,
        username: str | None = None,
        first_name: str | None = None,
    ) -> dict[str, Any]:
        """The chat, made known on first use (its first description wins)."""
        if chat_id not in self.chats:
            chat: dict[str, Any] = {"id": chat_id, "type": chat_type}
            if chat_type == "private":
                chat["first_name"] = first_name or f"User{chat_id}"
                if username:
                    chat["username"] = username
            else:
                chat["title"] = title or f"Group {chat_id}"
            self.chats[chat_id] = chat
        return self.chats[chat_id]

    def user_message(
        self,
        chat_id: int,
        user_id: int,
        *,
        chat_type: str = "private",
        username: str | None = None,
        first_name: str | None = None,
        reply_to: int | None = None,
        message_thread_id: int | None = None,
        **fields: Any,
    ) -> dict[str, Any]:
        """A new message from a user; ``fields`` (``text``, ``photo``, ...) go in as-is."""
        chat = self.add_chat(chat_id, chat_type=chat_type, username=username, first_name=first_name)
        sender: dict[str, Any] = {
            "id": user_id,
            "is_bot": False,
            "first_name": first_name or f"User{user_id}",
            "language_code": "en",
        }
        if username:
            sender["username"] = username
        return self.store_message(chat, sender, reply_to, message_thread_id, fields)

    def store_message(
        self,
        chat: Mapping[str, Any],
        sender: Mapping[str, Any],
        reply_to: int | None,
        thread_id: int | None,
        fields: Mapping[str, Any],
    ) -> dict[str, Any]:
        message: dict[str, Any] = {
            "message_id": self._next_message_id,
            "from": dict(sender),
            "chat": dict(chat),
            "date": int(time.time()),
        }
        self._next_message_id += 1
        if thread_id is not None:
            message["message_thread_id"] = thread_id
        if reply_to is not None:
            replied = dict(self.messages[(chat["id"], reply_to)])
            replied.pop("reply_to_message", None)  # Telegram nests one level only
            message["reply_to_message"] = replied
        message.update(fields)
        self.messages[(chat["id"], message["message_id"])] = message
        return dict(message)

    def set_text(
        self, chat_id: int, message_id: int, text: str, entities: list[Any] | None
    ) -> dict[str, Any]:
        """Edit a stored message's text (either side's) and return the new version."""
        message = self.messages[(chat_id, message_id)]
        message.update(text=text, edit_date=int(time.time()))
        message.pop("entities", None)
        if entities:
            message["entities"] = entities
        return dict(message)

    def photo_sizes(self) -> list[dict[str, Any]]:
        """A PhotoSize list (small, large) whose files can be downloaded."""
        sizes = []
        for suffix, width, height in (("s", 90, 60), ("x", 1280, 853)):
            file_id = f"F{len(self._files) + 1:04d}{suffix}{secrets.token_hex(4)}"
            self._files[file_id] = (f"photos/file_{len(self._files)}.jpg", _FAKE_JPEG)
            sizes.append(
                {
                    "file_id": file_id,
                    "file_unique_id": f"u{file_id}",
                    "width": width,
                    "height": height,
                    "file_size": len(_FAKE_JPEG),
                }
            )
        return sizes

    def add_file(self, content: bytes, path: str) -> str:
        """A downloadable file; returns its file_id."""
        file_id = f"F{len(self._files) + 1:04d}{secrets.token_hex(4)}"
        self._files[file_id] = (
            f"{path.rsplit('.', 1)[0]}_{len(self._files)}.{path.rsplit('.', 1)[-1]}",
            content,
        )
        return file_id

    def photo_of(self, content: bytes, width: int, height: int) -> list[dict[str, Any]]:
        """A one-size PhotoSize list for ``content``."""
        file_id = self.add_file(content, "photos/file.jpg")
        return [
            {
                "file_id": file_id,
                "file_unique_id": f"u{file_id}",
                "width": width,
                "height": height,
                "file_size": len(content),
            }
        ]

    def file(self, file_id: str) -> dict[str, Any] | None:
        if file_id not in self._files:
            return None
        path, content = self._files[file_id]
        return {
            "file_id": file_id,
            "file_unique_id": f"u{file_id}",
            "file_size": len(content),
            "file_path": path,
        }

    def file_content(self, path: str) -> bytes | None:
        return next((content for p, content in self._files.values() if p == path), None)

    def callback_query(self, chat_id: int, user_id: int, data: str, message_id: int) -> dict[str, Any]:
        query_id = str(secrets.randbits(60))
        self.callback_queries.add(query_id)
        return {
            "id": query_id,
            "from": {"id": user_id, "is_bot": False, "first_name": f"User{user_id}"},
            "chat_instance": str(chat_id),
            "data": data,
            "message": dict(self.messages[(chat_id, message_id)]),
        }


def detect_entities(text: str) -> list[dict[str, Any]]:
    """What Telegram marks in a user's text: a leading ``/command`` and ``@mentions``,
    with offsets and lengths in UTF-16 code units."""

    def span(kind: str, start: int, end: int) -> dict[str, Any]:
        return {"type": kind, "offset": utf16_len(text[:start]), "length": utf16_len(text[start:end])}

    found = []
    if command := _BOT_COMMAND.match(text):
        found.append(span("bot_command", 0, command.end()))
    found.extend(span("mention", m.start(), m.end()) for m in _MENTION.finditer(text))
    return found
