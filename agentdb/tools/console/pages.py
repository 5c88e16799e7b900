"""The console's HTML: server-rendered, escaped, no script but the live-update listener."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from html import escape
from typing import Any

from agentdb.overview import Activity

__all__ = ["age", "budget_bar", "chart", "form", "h", "layout", "pretty", "table"]

_STYLE = """
body{font:14px/1.4 system-ui,sans-serif;margin:0;color:#222;background:#fafafa}
header{background:#1f2937;color:#fff;padding:8px 16px;display:flex;gap:16px;align-items:center}
header a{color:#cfe3ff;text-decoration:none}header .who{margin-left:auto;color:#ddd}
main{padding:12px 16px;max-width:1200px}
h1{font-size:20px}h2{font-size:16px;margin-top:20px}
table{border-collapse:collapse;width:100%;background:#fff;margin:6px 0}
td,th{border:1px solid #ddd;padding:4px 6px;text-align:left;vertical-align:top}
th{background:#f0f0f0}code,pre{font:12px ui-monospace,monospace}pre{margin:0;white-space:pre-wrap}
.flash{padding:8px;margin:8px 0;border-radius:4px}.ok{background:#dcfce7}.err{background:#fee2e2}
form.inline{display:inline-block;margin:2px}button{cursor:pointer}
.state-succeeded{color:#166534}.state-failed,.state-dead{color:#b91c1c}
.state-waiting{color:#92400e}.state-running{color:#1d4ed8}.state-cancelled{color:#6b7280}
.card{background:#fff;border:1px solid #ddd;border-radius:6px;padding:8px 12px;margin:8px 0}
"""

# Live updates: the page listens to /live (server-sent events) and reloads when
# what it shows has changed - unless someone is typing in it.
_LIVE = """
<script>
(function(){
  var first=document.body.dataset.fingerprint||null, es=new EventSource('/live');
  // A form on its way out is the next page: no reload may cut it short.
  document.addEventListener('submit', function(){ es.close(); });
  es.onmessage=function(m){
    if(first===null){first=m.data;return;}
    if(m.data!==first){
      var a=document.activeElement;
      if(a&&(a.tagName==='INPUT'||a.tagName==='TEXTAREA')&&a.value){return;}
      location.reload();
    }
  };
})();
</script>
"""


def h(value: object) -> str:
    """``value`` as HTML text."""
    return escape("" if value is None else str(value), quote=True)


def pretty(value: Any) -> str:
    if value is None or value == {} or value == []:
        return ""
    return f"<pre>{h(json.dumps(value, indent=1, sort_keys=True, default=str))}</pre>"


def age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    s = int(seconds)
    if s < 120:
        return f"{s}s"
    if s < 7200:
        return f"{s // 60}m"
    if s < 172800:
        return f"{s // 3600}h"
    return f"{s // 86400}d"


def layout(
    title: str,
    body: str,
    *,
    who: str | None,
    csrf: str = "",
    flash: str | None = None,
    error: str | None = None,
    live: bool = True,
    fingerprint: str = "",
) -> str:
    nav = ""
    if who is not None:
        nav = (
            '<a href="/">Tenants</a><a href="/inbox" id="nav-inbox">Approvals</a>'
            '<a href="/effects">Unsettled effects</a><a href="/outbox">Dead messages</a>'
            f'<span class="who">signed in as <b id="who">{h(who)}</b></span>'
            f'<form class="inline" method="post" action="/logout">'
            f'<input type="hidden" name="csrf" value="{h(csrf)}"><button>Sign out</button></form>'
        )
    notes = ""
    if flash:
        notes += f'<div class="flash ok" id="flash">{h(flash)}</div>'
    if error:
        notes += f'<div class="flash err" id="error">{h(error)}</div>'
    return (
        "<!doctype html><html><head><meta charset='utf-8'>"
        f"<title>{h(title)} - agentdb</title><style>{_STYLE}</style></head>"
        f'<body data-fingerprint="{h(fingerprint)}">'
        f"<header><b>agentdb console</b>{nav}</header><main><h1>{h(title)}</h1>{notes}{body}"
        f"</main>{_LIVE if live and who else ''}</body></html>"
    )


def table(headers: Sequence[str], rows: Iterable[Sequence[str]], *, id: str = "") -> str:
    """A table; the cells are HTML already (escape with :func:`h`)."""
    head = "".join(f"<th>{h(x)}</th>" for x in headers)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>" for r in rows)
    ident = f' id="{h(id)}"' if id else ""
    if not body:
        body = f'<tr><td colspan="{len(headers)}"><i>none</i></td></tr>'
    return f"<table{ident}><tr>{head}</tr>{body}</table>"


def form(action: str, csrf: str, button: str, fields: str = "", *, id: str = "") -> str:
    ident = f' id="{h(id)}"' if id else ""
    return (
        f'<form class="inline" method="post" action="{h(action)}"{ident}>'
        f'<input type="hidden" name="csrf" value="{h(csrf)}">{fields}'
        f"<button>{h(button)}</button></form>"
    )


def chart(points: Sequence[Activity], *, width: int = 600, height: int = 120) -> str:
    """The last hour per minute as inline SVG: finished (green bars), created (blue
    ticks), backlog (the orange line)."""
    if not points:
        return ""
    top = max(1, *(max(p.created, p.finished, p.backlog) for p in points))
    step = width / len(points)
    parts = [
        f'<svg class="chart" width="{width}" height="{height + 16}" '
        f'viewBox="0 0 {width} {height + 16}" role="img" aria-label="last hour">'
        f'<rect width="{width}" height="{height}" fill="#fff" stroke="#ddd"/>'
    ]
    line = []
    for i, p in enumerate(points):
        x = i * step
        bar = p.finished / top * height
        parts.append(
            f'<rect x="{x:.1f}" y="{height - bar:.1f}" width="{max(step - 1, 1):.1f}" '
            f'height="{bar:.1f}" fill="#86efac"><title>{h(p.minute)}: {p.finished} finished, '
            f"{p.created} created, backlog {p.backlog}</title></rect>"
        )
        if p.created:
            y = height - p.created / top * height
            parts.append(
                f'<rect x="{x:.1f}" y="{y:.1f}" width="{max(step - 1, 1):.1f}" height="2" '
                'fill="#2563eb"/>'
            )
        line.append(f"{x + step / 2:.1f},{height - p.backlog / top * height:.1f}")
    parts.append(f'<polyline points="{" ".join(line)}" fill="none" stroke="#f97316"/>')
    parts.append(
        f'<text x="2" y="{height + 13}" font-size="11">-{len(points)} min</text>'
        f'<text x="{width - 30}" y="{height + 13}" font-size="11">now</text>'
        f'<text x="{width / 2 - 120:.0f}" y="{height + 13}" font-size="11">'
        f"finished (bars) / created (blue) / backlog (line), max {top}</text></svg>"
    )
    return "".join(parts)


def budget_bar(b: dict[str, Any], *, width: int = 300) -> str:
    """One budget as a bar: spent (dark), held (light), the rest of the limit (empty)."""
    limit = max(int(b["limit"]), 1)
    spent = int(b["spent"]) / limit * width
    held = int(b["held"]) / limit * width
    return (
        f'<svg class="budget" width="{width}" height="14" role="img">'
        f'<rect width="{width}" height="14" fill="#fff" stroke="#999"/>'
        f'<rect width="{spent:.1f}" height="14" fill="#1d4ed8"/>'
        f'<rect x="{spent:.1f}" width="{held:.1f}" height="14" fill="#93c5fd"/></svg> '
        f"{h(b['unit'])}: spent {b['spent']} + held {b['held']} of {b['limit']}"
        f" ({h(b['period'])}{', task ' + h(b['task_id']) if b['task_id'] else ''})"
    )
