"""Submit Django admin forms the way a browser does: read the rendered form, change fields, post."""

from __future__ import annotations

from html.parser import HTMLParser
from typing import Any


class _FormReader(HTMLParser):
    """Collects the submittable values of each ``<form method=post>`` on a page."""

    def __init__(self) -> None:
        super().__init__()
        self.forms: list[dict[str, list[str]]] = []
        self.values: dict[str, list[str]] = {}
        self._in_form = False
        self._select: str | None = None
        self._textarea: str | None = None
        self._text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        attr = {key: value or "" for key, value in attrs}
        if tag == "form" and attr.get("method", "").lower() == "post":
            self._in_form, self.values = True, {}
            self.forms.append(self.values)
        if not self._in_form:
            return
        name = attr.get("name")
        if tag == "input" and name:
            kind = attr.get("type", "text").lower()
            if kind in ("submit", "button", "image", "file"):
                return
            if kind in ("checkbox", "radio") and "checked" not in attr:
                return
            default = "on" if kind in ("checkbox", "radio") else ""
            self.values.setdefault(name, []).append(attr.get("value", default))
        elif tag == "select" and name:
            self._select = name
            self.values.setdefault(name, [])
        elif tag == "option" and self._select and "selected" in attr:
            self.values[self._select].append(attr.get("value", ""))
        elif tag == "textarea" and name:
            self._textarea, self._text = name, []

    def handle_data(self, data: str) -> None:
        if self._textarea:
            self._text.append(data)

    def handle_endtag(self, tag: str) -> None:
        if tag == "select":
            self._select = None
        elif tag == "textarea" and self._textarea:
            self.values.setdefault(self._textarea, []).append("".join(self._text).strip("\n"))
            self._textarea = None
        elif tag == "form" and self._in_form:
            self._in_form = False


def submit(client: Any, url: str, changes: dict[str, str | None]) -> Any:
    """GET ``url``, apply ``changes`` (None clears a field), POST it back; returns the response."""
    return client.post(url, filled(client, url, changes))


def filled(client: Any, url: str, changes: dict[str, str | None]) -> dict[str, list[str]]:
    """The form at ``url`` as ``client`` reads it, with ``changes`` applied (None clears a field): what
    a browser would post (another client may post it)."""
    page = client.get(url)
    assert page.status_code == 200, page.status_code
    reader = _FormReader()
    reader.feed(page.content.decode())
    form = max(reader.forms, key=len)  # the page's own form, not the header's logout button
    data = {name: values for name, values in form.items() if values}
    for name, value in changes.items():
        if value is None:
            data.pop(name, None)
        else:
            data[name] = [value]
    return data
