"""Slack, Telegram and generic webhooks: JSON over HTTPS, escaped for each."""

from __future__ import annotations

import hashlib
import hmac
import html
import json
import time
from collections.abc import Callable
from typing import Any

from cron_celery.notifiers.base import Channel, Message, post, post_json

#: Telegram refuses longer messages; Slack folds long ones.
TELEGRAM_MAX, SLACK_MAX = 4096, 3500


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _fit(text: str, escape: Callable[[str], str], room: int) -> str:
    """``escape(text)`` in at most ``room`` characters: shortened before escaping (so no
    entity is cut in half), with a visible "…"; empty when nothing fits."""
    escaped = escape(text)
    keep = len(text)
    while len(escaped) > room and keep > 0:
        keep = max(0, keep - max(1, len(escaped) - room))
        escaped = escape(text[:keep] + "…")
    return escaped if len(escaped) <= room else ""


def slack_escape(text: str) -> str:
    """Slack mrkdwn: only &, < and > are special (they would start entities and links)."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


class SlackChannel(Channel):
    """An incoming webhook: ``{"webhook_url": "https://hooks.slack.com/services/..."}``."""

    required = ("webhook_url",)
    secrets = ("webhook_url",)

    def render(self, message: Message) -> dict[str, Any]:
        icon = ":red_circle:" if message.failing else ":warning:" if message.warning else ":large_green_circle:"
        lines = [f"{icon} *{slack_escape(message.title)}*"]
        lines += [f"*{label}:* {slack_escape(value)}" for label, value in message.facts()]
        tail = [f"<{message.admin_url}|Open the execution in the admin>"] if message.admin_url else []
        if message.error.strip():
            room = SLACK_MAX - len("\n".join(lines + tail)) - 10
            error = _fit(message.excerpt().replace("```", "'''"), slack_escape, room)
            if error:
                lines.append("```" + error + "```")
        return {"text": "\n".join(lines + tail)}

    def send(self, message: Message, timeout: float) -> None:
        post_json(str(self.options["webhook_url"]), self.render(message), timeout)


class TelegramChannel(Channel):
    """A bot: ``{"bot_token": "...", "chat_id": "...", "api_url": "https://api.telegram.org"}``."""

    required = ("bot_token", "chat_id")
    secrets = ("bot_token",)

    def render(self, message: Message) -> dict[str, Any]:
        parts = [f"<b>{html.escape(message.title, quote=False)}</b>"]
        parts += [f"<b>{html.escape(label, quote=False)}:</b> {html.escape(value, quote=False)}"
                  for label, value in message.facts()]
        tail = []
        if message.admin_url:
            tail.append(f'<a href="{html.escape(message.admin_url)}">Open the execution in the admin</a>')
        if message.error.strip():
            room = TELEGRAM_MAX - len("\n".join(parts + tail)) - 20
            error = _fit(message.excerpt(), lambda text: html.escape(text, quote=False), room)
            if error:
                parts.append(f"<pre>{error}</pre>")
        return {"chat_id": self.options["chat_id"], "text": _cut("\n".join(parts + tail), TELEGRAM_MAX),
                "parse_mode": "HTML", "disable_web_page_preview": True}

    def send(self, message: Message, timeout: float) -> None:
        base = str(self.options.get("api_url") or "https://api.telegram.org").rstrip("/")
        post_json(f"{base}/bot{self.options['bot_token']}/sendMessage", self.render(message), timeout)


class WebhookChannel(Channel):
    """Any HTTP endpoint: ``{"url": "...", "secret": "..."}``. The body is the message as
    JSON. Every attempt carries ``X-Cron-Celery-Timestamp`` (Unix seconds, when it was sent)
    and ``X-Cron-Celery-Delivery`` (the message's ``delivery_id``, also in the signed body: the
    same for every attempt of one alert row, even when what it says changed meanwhile, so a
    receiver can drop duplicates; a message without one, the hex SHA-256 of the body); with a secret, also
    ``X-Cron-Celery-Signature: sha256=<HMAC-SHA256 of "<timestamp>.<body>">``, so a receiver
    can refuse an old or replayed delivery (docs/notifications.md shows how)."""

    required = ("url",)
    secrets = ("secret", "url")

    def send(self, message: Message, timeout: float) -> None:
        body = json.dumps(message.as_dict(), ensure_ascii=False, sort_keys=True).encode()
        stamp = str(int(time.time()))
        headers = {"Content-Type": "application/json; charset=utf-8", "X-Cron-Celery-Event": message.event,
                   "X-Cron-Celery-Timestamp": stamp,
                   "X-Cron-Celery-Delivery": message.delivery_id or hashlib.sha256(body).hexdigest()}
        secret = self.options.get("secret")
        if secret:
            digest = hmac.new(str(secret).encode(), stamp.encode() + b"." + body, hashlib.sha256).hexdigest()
            headers["X-Cron-Celery-Signature"] = f"sha256={digest}"
        post(str(self.options["url"]), body, timeout, headers)
