"""HTML building blocks of the dashboard: every value goes through ``esc`` (or is a
number formatted here); markup is only ever written by this package."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from html import escape
from urllib.parse import quote, urlencode

from mnemo.adapters.admin.auth import AdminSession

NAV = (
    ("overview", "/admin", "Overview"),
    ("users", "/admin/users", "Users"),
    ("memory", "/admin/memory", "Memory"),
    ("sessions", "/admin/sessions", "Sessions"),
    ("skills", "/admin/skills", "Skills"),
    ("cron", "/admin/cron", "Cron"),
    ("jobs", "/admin/jobs", "Jobs"),
)


def esc(value: object) -> str:
    return escape("" if value is None else str(value), quote=True)


def href(path: str, **query: object) -> str:
    """A dashboard link; ``path`` segments are quoted by the caller with ``seg``."""
    q = {k: str(v) for k, v in query.items() if v is not None and v != ""}
    return esc(path + (f"?{urlencode(q)}" if q else ""))


def seg(text: str) -> str:
    return quote(text, safe=":")


def layout(title: str, body: str, *, active: str | None = None, session: AdminSession | None = None) -> str:
    nav = ""
    if session is not None:
        current = ' aria-current="page"'
        links = "".join(
            f'<a href="{url}"{current if key == active else ""}>{esc(label)}</a>' for key, url, label in NAV
        )
        signout = (
            f'<form method="post" action="/admin/signout" class="signout">{csrf_field(session)}'
            '<button type="submit">Sign out</button></form>'
        )
        nav = f'<nav aria-label="Dashboard">{links}{signout}</nav>'
    flashes = ""
    if session is not None and session.flash:
        flashes = "".join(
            f'<p class="flash {esc(kind)}" role="{"alert" if kind == "error" else "status"}">{esc(text)}</p>'
            for kind, text in session.flash
        )
        session.flash.clear()
    return (
        "<!doctype html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{esc(title)} · mnemo admin</title>"
        '<link rel="icon" href="data:,">'  # no favicon request
        '<link rel="stylesheet" href="/admin/static/admin.css">'
        '<script src="/admin/static/admin.js" defer></script>'
        "</head><body>"
        f'<header><span class="brand">mnemo admin</span>{nav}</header>'
        f"<main><h1>{esc(title)}</h1>{flashes}{body}</main>"
        "</body></html>"
    )


def csrf_field(session: AdminSession) -> str:
    return f'<input type="hidden" name="csrf" value="{esc(session.csrf)}">'


def post_button(
    session: AdminSession,
    action: str,
    label: str,
    fields: Mapping[str, str] | None = None,
    *,
    confirm: str | None = None,
    kind: str = "",
) -> str:
    hidden = "".join(
        f'<input type="hidden" name="{esc(k)}" value="{esc(v)}">' for k, v in (fields or {}).items()
    )
    data = f' data-confirm="{esc(confirm)}"' if confirm else ""
    cls = f' class="{esc(kind)}"' if kind else ""
    return (
        f'<form method="post" action="{esc(action)}" class="inline"{data}>{csrf_field(session)}{hidden}'
        f'<button type="submit"{cls}>{esc(label)}</button></form>'
    )


def table(headers: Sequence[str], rows: Iterable[Sequence[str]], *, empty: str = "Nothing here yet.") -> str:
    """``rows`` hold ready HTML (escape values with ``esc`` first)."""
    body = "".join("<tr>" + "".join(f"<td>{cell}</td>" for cell in row) + "</tr>" for row in rows)
    if not body:
        return f'<p class="muted">{esc(empty)}</p>'
    head = "".join(f'<th scope="col">{esc(h)}</th>' for h in headers)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def cards(items: Iterable[tuple[str, str]]) -> str:
    """(label, ready HTML value) tiles."""
    tiles = "".join(
        f'<div class="card"><div class="label">{esc(k)}</div><div class="value">{v}</div></div>'
        for k, v in items
    )
    return f'<div class="cards">{tiles}</div>'


def badge(text: str, kind: str = "") -> str:
    return f'<span class="badge {esc(kind)}">{esc(text)}</span>'


def usd(value: float | None) -> str:
    return "—" if value is None else f"${value:,.4f}"
