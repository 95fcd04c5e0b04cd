"""``report.html``: the summary as one self-contained page (inline CSS, SVG and a little JS; nothing fetched at view
time), written beside ``report.md`` by ``fuzz``, ``fleet`` and ``crashpoints`` through ``report.write_reports``.

It renders only what ``summary.json`` holds (plus the findings), so a page never says what the JSON does not: the
buckets, cases and seconds per property and per swarm feature, what recovery cost, the shards of a fleet, trends
across nights (a corpus), and for crash campaigns the crash-point map (``summary["io_map"]``, harness/judging/iomap.py).
The summary is embedded as JSON too; the page's script counts the buckets and cases from it into the header, so a
browser test sees the page and the JSON agree.
"""

from __future__ import annotations

import json
from html import escape
from pathlib import Path

from harness.report.coverage import coverage_html

VERDICT_COLOURS = {"pass": "#2e7d32", "loud-failure": "#ef6c00", "silent-corruption": "#b71c1c",
                   "data-loss": "#ad1457", "hang": "#6a1b9a", "crash": "#d84315", None: "#9e9e9e"}
IO_COLOURS = {"write": "#78909c", "fsync": "#1565c0", "rename": "#7b1fa2", "open": "#cfd8dc", "unlink": "#ef6c00",
              "mkdir": "#8d6e63", "truncate": "#f9a825", "other": "#b0bec5"}

CSS = "".join((
    "body{font:14px/1.45 system-ui,sans-serif;margin:24px auto;max-width:1200px;color:#222;padding:0 16px}",
    "h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #ddd}",
    "table{border-collapse:collapse;width:100%;margin:6px 0}",
    "th,td{border:1px solid #e0e0e0;padding:3px 7px;text-align:left;vertical-align:top}th{background:#f5f5f5}",
    "td{overflow-wrap:break-word}td.n{text-align:right;font-variant-numeric:tabular-nums}",
    ".new{color:#b71c1c;font-weight:600}.known{color:#555}.ok{color:#2e7d32}.bad{color:#b71c1c;font-weight:600}",
    ".muted{color:#777}code{font-size:12px}svg text{font:11px system-ui,sans-serif}",
    ".pill{display:inline-block;white-space:nowrap;padding:0 6px;border-radius:8px;color:#fff;font-size:12px}",
    "#totals{font-size:15px;margin:6px 0 2px}",
    "table.src{font:12px/1.3 monospace;white-space:pre}table.src td{border:0;padding:0 6px}td.ln{color:#999;"
    "text-align:right;width:1%}tr.miss{background:#fde0e0}tr.part{background:#fff3cd}tr.dev{background:#eceff1;"
    "color:#777}",
))

SCRIPT = """
const data = JSON.parse(document.getElementById('summary-data').textContent);
const b = data.buckets || [];
const crashes = data.crash_results || [];
const failing = crashes.filter(x => x.verdict !== null && x.verdict !== 'pass').length;
const judged = crashes.filter(x => x.verdict !== null).length;
const fresh = b.filter(x => String(x.status).startsWith('new')).length;
const cases = Object.values(data.cases_run || {}).reduce((a, c) => a + c, 0);
const hits = b.reduce((a, x) => a + (x.cases || 0), 0);
document.getElementById('totals').textContent = data.buckets === undefined ?
  `${judged}/${crashes.length} crash points and states judged, ${failing} failing` :
  `${b.length} buckets (${fresh} new, ${b.length - fresh} known), ${hits} failing cases, ${cases} cases run`;
document.querySelectorAll('th[data-sort]').forEach(th => th.addEventListener('click', () => {
  const body = th.closest('table').tBodies[0], i = th.cellIndex;
  const rows = [...body.rows].sort((x, y) => (parseFloat(y.cells[i].textContent) || 0) -
                                             (parseFloat(x.cells[i].textContent) || 0));
  rows.forEach(r => body.appendChild(r));
}));
"""


def render(summary: dict, rows: list[dict], out: Path | None = None) -> str:
    """The page of one summary and its findings (``out``: the folder the page lives in, for relative links)."""
    parts = [_header(summary), _fleet(summary), _buckets(summary, out), _per(summary), _recovery(summary),
             _io_map(summary.get("io_map")), _crash_table(summary.get("crash_results")), _trends(summary),
             coverage_html(summary.get("coverage")),
             *(_io_map(row["io_map"], f"finding {n} ({row.get('property', '')}, bucket {row.get('bucket')})")
               for n, row in enumerate(rows) if row.get("io_map")),
             _findings(rows, out)]
    data = json.dumps(summary, sort_keys=True).replace("</", "<\\/")
    return ("<!doctype html><html lang=en><head><meta charset=utf-8>"
            f"<title>ckpt-harness report: {escape(str(summary.get('sut', '')))}</title><style>{CSS}</style></head>"
            f"<body>{''.join(p for p in parts if p)}"
            f"<script type=application/json id=summary-data>{data}</script><script>{SCRIPT}</script></body></html>\n")


def _header(s: dict) -> str:
    kind = s.get("kind", "campaign")
    wall = s.get("wall_time_s", "-")
    seed = s.get("seed") if s.get("seed") is not None else "-"
    line = (f"{kind}, {wall} s wall, {s.get('ranks', '-')} rank(s), launch {escape(str(s.get('launch_mode', '-')))}, "
            f"seed {seed}, devices {escape(', '.join(s.get('devices', [])) or '-')}, "
            f"shims {escape(', '.join(s.get('shims', [])) or 'none')}")
    return (f"<h1>ckpt-harness report: {escape(str(s.get('sut', '')))}</h1><p id=totals class=muted></p>"
            f"<p class=muted>{line}</p>")


def _fleet(s: dict) -> str:
    f = s.get("fleet")
    if not f:
        return ""
    rows = "".join(
        f"<tr class=shard data-shard='{escape(x['id'])}' data-status='{escape(x['status'])}'><td>{escape(x['id'])}</td>"
        f"<td>{escape(x['sut'])}</td><td class=n>{x['ranks']}</td><td>{escape(x['device'])}</td>"
        f"<td class=where>{escape(x.get('where', '-'))}</td><td class=n>{x['seed']}"
        f"</td><td class={'ok' if x['status'] == 'ok' else 'bad'}>{escape(x['status'])}</td>"
        f"<td class=n>{len(x['attempts'])}</td><td class=n>{x['seconds']}</td><td class=n>{x['cases']}</td>"
        f"<td class=n>{x['new_buckets']}</td><td>{_attempts(x['attempts'])}</td></tr>" for x in s.get("shards", []))
    return (f"<h2>Fleet</h2><p>{f['wall_s']} s wall, {f['inside_shards_s']} s with a shard running: "
            f"<b>fleet overhead {f['overhead_s']} s</b> (Ray start {f['ray_start_s']} s, merge {f.get('merge_s', '-')}"
            f" s); {escape(str(f['ray']))}; plan {escape(str(f.get('plan', '-')))}.</p>"
            + _table("shards", ["shard", "SUT", "ranks", "device", "where", "seed", "status", "attempts", "#seconds",
                                "#cases", "new buckets", "what went wrong"], rows))


def _table(tid: str, headers: list[str], body: str) -> str:
    """One table of the page; a header written "#name" is one the page's script sorts numerically (data-sort)."""
    head = "".join(f"<th data-sort>{h[1:]}</th>" if h.startswith("#") else f"<th>{h}</th>" for h in headers)
    return f"<table id={tid}><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _attempts(attempts: list[dict]) -> str:
    return "<br>".join(f"attempt {a['attempt']}: {escape(str(a['status']))}: {escape(str(a['error']))}"
                       for a in attempts if a.get("status") != "ok")


def _buckets(s: dict, out: Path | None) -> str:
    if "buckets" not in s:  # crashpoints: its verdicts are the crash table
        return ""
    buckets = s["buckets"]
    if not buckets:
        return "<h2>Buckets</h2><p class=ok id=no-buckets>No failures.</p>"
    first = {}
    for night in s.get("trends", []):
        for b, when in night.get("first_seen", {}).items():
            first.setdefault(b, when)
    body = []
    for b in buckets:
        new = str(b["status"]).startswith("new")
        seen = first.get(b["bucket"]) or (f"this run, {b['found_at_s']} s in" if b.get("found_at_s") is not None
                                          else "-")
        body.append(
            f"<tr class=bucket data-bucket='{escape(b['bucket'])}' data-status='{'new' if new else 'known'}' "
            f"data-cases={b['cases']}><td><code>{escape(b['bucket'])}</code><br>"
            f"{escape((b.get('title') or '')[:200])}</td><td class={'new' if new else 'known'}>{escape(b['status'])}"
            f"</td><td>{escape(seen)}</td><td class=n>{b['cases']}</td>"
            f"<td>{escape(', '.join(b.get('shards', [])) or '-')}</td>"
            f"<td>{escape(b.get('smallest') or '-')}</td><td>{_verdict(b.get('verdict'))}</td>"
            f"<td>{_link(b.get('replay'), out)}</td><td>{_repro(b, out)}</td></tr>")
    return "<h2>Buckets (one root cause each)</h2>" + _table(
        "buckets", ["bucket", "new/known", "first seen", "#cases hit", "shards", "smallest case", "verdict", "replay",
                    "standalone repro"], "".join(body))


def _verdict(v: str | None) -> str:
    if not v:
        return "-"
    return f"<span class=pill style='background:{VERDICT_COLOURS.get(v, '#555')}'>{escape(v)}</span>"


def _link(replay: str | None, out: Path | None) -> str:
    """The replay command, and the finding file as a link relative to the page."""
    if not replay:
        return "-"
    path = replay.split(" replay ", 1)[-1]
    href = path
    if out is not None:
        try:
            href = str(Path(path).resolve().relative_to(out.resolve()))
        except ValueError:
            href = Path(path).as_uri() if Path(path).is_absolute() else path
    return f"<a href='{escape(href)}' title='{escape(replay)}'>{escape(Path(path).name)}</a>"


def _repro(b: dict, out: Path | None) -> str:
    """The standalone reproducer of a finding (its ``repro`` folder and ``standalone_verified``), where it has one."""
    if "repro" not in b and "standalone_verified" not in b:
        return "-"
    verified = b.get("standalone_verified")
    mark = "" if verified is None else (" <span class=ok>verified</span>" if verified else
                                        " <span class=bad>not verified</span>")
    repro = b.get("repro")
    return (f"<a href='{escape(str(repro))}'>{escape(Path(str(repro)).name)}</a>" if repro else "-") + mark


def _bars(values: dict[str, float], unit: str, colour: str) -> str:
    """A horizontal bar chart (SVG) of ``values``."""
    if not values:
        return ""
    top = max(values.values()) or 1
    h = 18
    items = "".join(
        f"<text x=0 y={i * h + 13}>{escape(k[:34])}</text><rect x=240 y={i * h + 3} height=12 "
        f"width={max(1.0, 420 * v / top):.1f} fill='{colour}'><title>{escape(k)}: {v} {unit}</title></rect>"
        f"<text x={246 + 420 * v / top:.1f} y={i * h + 13}>{v}</text>" for i, (k, v) in enumerate(values.items()))
    return f"<svg width=720 height={len(values) * h + 4} role=img>{items}</svg>"


def _per(s: dict) -> str:
    cases, secs = s.get("cases_run", {}), s.get("seconds_per_property", {})
    props = sorted(set(cases) | set(secs))
    out = ""
    if props:
        rows = "".join(f"<tr class=property data-property='{escape(p)}'><td>{escape(p)}</td><td class=n>"
                       f"{cases.get(p, 0)}</td><td class=n>{secs.get(p, '-')}</td></tr>" for p in props)
        skipped = "".join(f"<tr><td>{escape(p)}</td><td colspan=2 class=muted>skipped: {escape(why)}</td></tr>"
                          for p, why in s.get("skipped_properties", {}).items())
        out += ("<h2>Cases and seconds per property</h2>"
                + _table("properties", ["property", "#cases", "#seconds"], rows + skipped)
                + _bars({p: cases.get(p, 0) for p in props}, "cases", "#42a5f5")
                + _bars({p: secs.get(p, 0) for p in props if p in secs}, "s", "#90a4ae"))
    swarm = s.get("swarm_per_feature", {})
    if swarm:
        rows = "".join(f"<tr class=feature><td>{escape(f)}</td><td class=n>{v['cases']}</td><td class=n>"
                       f"{v['seconds']}</td></tr>" for f, v in swarm.items())
        out += ("<h2>Cases and seconds per swarm feature</h2><p class=muted>Cases of the batches that left the "
                "feature out (properties/generate/swarm.py).</p>"
                + _table("swarm", ["left out", "#cases", "#seconds"], rows)
                + _bars({f: v["cases"] for f, v in swarm.items()}, "cases", "#66bb6a"))
    return out


def _recovery(s: dict) -> str:
    rec = s.get("recovery") or {}
    if not rec and not s.get("launches"):
        return ""
    items = "".join(f"<tr><td>{escape(k.replace('_', ' '))}</td><td class=n>{v}</td></tr>" for k, v in rec.items())
    return (f"<h2>Launches and recovery</h2><table id=recovery><tbody><tr><td>launches</td><td class=n>"
            f"{s.get('launches', 0)}</td></tr>{items}</tbody></table>")


def _io_map(m: dict | None, of: str = "") -> str:
    """The crash-point map: the save's recorded IO as a timeline per rank and writer process, each crash point on
    the call it kills and each power-loss state at the place in the IO it cuts, coloured by verdict (``of``: the
    fault finding it belongs to, in a fault campaign's page, which has one per such finding)."""
    if not m or not m.get("events"):
        return ""
    lanes, events, marks = m["lanes"], m["events"], m.get("marks", [])
    n = max(1, max(e["t"] for e in events) + 1)
    stack: dict[int, int] = {}
    level: dict[int, int] = {}
    for i, mk in enumerate(marks):  # states at one place in the IO (a prefix, lost data there) stack upwards
        if mk["kind"] == "state":
            level[i] = stack[mk["t"]] = stack.get(mk["t"], -1) + 1
    row = 12 * (max(stack.values(), default=0) + 1)
    left, width, lane_h, top = 190, 900, 34, row + 30
    x = lambda t: left + width * (t + 0.5) / n  # noqa: E731
    height = top + lane_h * len(lanes) + 40
    svg = [f"<svg {'class=io-map' if of else 'id=io-map'} width={left + width + 20} height={height} role=img>",
           f"<text x=0 y={row + 4}>power-loss states</text><line x1={left} x2={left + width} y1={row + 12} "
           f"y2={row + 12} stroke='#ddd'/>"]
    for i, lane in enumerate(lanes):
        y = top + i * lane_h
        svg.append(f"<text x=0 y={y + 14}>{escape(lane['label'])}</text><line x1={left} x2={left + width} "
                   f"y1={y + 10} y2={y + 10} stroke='#eee'/>")
    for e in events:
        y = top + e["lane"] * lane_h
        svg.append(f"<rect class=io data-kind='{escape(e['kind'])}' x={x(e['t']) - 2:.1f} y={y + 4} width=4 "
                   f"height=12 fill='{IO_COLOURS.get(e['kind'], IO_COLOURS['other'])}'><title>#{e['t']} "
                   f"{escape(e['call'])} {escape(e.get('path') or '')}</title></rect>")
    for i, mk in enumerate(marks):
        colour = VERDICT_COLOURS.get(mk.get("verdict"), VERDICT_COLOURS[None])
        title = f"<title>{escape(mk['label'])}: {escape(str(mk.get('verdict') or 'not judged'))}</title>"
        cls = f"class='mark {mk['kind']}' data-verdict='{escape(str(mk.get('verdict')))}'"
        if mk["kind"] == "state":
            cx = left + width * mk["t"] / n
            tip = row + 10 - 12 * level[i]
            svg.append(f"<path {cls} d='M{cx:.1f},{tip} l-5,-9 h10 z' fill='{colour}'>{title}</path>")
        else:
            y = top + mk["lane"] * lane_h + 26
            svg.append(f"<circle {cls} cx={x(mk['t']):.1f} cy={y} r=5 fill='{colour}'>{title}</circle>")
    svg.append("</svg>")
    legend = " ".join(f"<span class=pill style='background:{c}'>{k}</span>" for k, c in IO_COLOURS.items()) + \
        " &nbsp; " + " ".join(f"<span class=pill style='background:{c}'>{k or 'not judged'}</span>"
                              for k, c in VERDICT_COLOURS.items())
    failing = sum(1 for mk in marks if mk.get("verdict") not in ("pass", None))
    title = f"Crash-point map: {escape(of)}" if of else "Crash-point map"
    return (f"<h2>{title}</h2><p>Op {m.get('op')} of {escape(str(m.get('sut', '')))}: {len(events)} "
            f"recorded IO calls in {len(lanes)} process(es); {len(marks)} crash points and power-loss states, "
            f"<b>{failing} failing</b>. Circles: a SIGKILL at that call (below its lane); triangles (top row): a "
            f"power loss after that much of the IO. Hover for details.</p>{''.join(svg)}<p>{legend}</p>")


def _crash_table(results: list[dict] | None) -> str:
    if not results:
        return ""
    rows = "".join(f"<tr class=crash data-verdict='{escape(str(r.get('verdict')))}'><td>{escape(r['kind'])}</td>"
                   f"<td>{escape(r['label'])}</td><td>{_verdict(r.get('verdict'))}</td>"
                   f"<td>{escape(r.get('detail') or '')}</td></tr>" for r in results)
    return "<h2>Crash points and states</h2>" + _table("crashes", ["kind", "where", "verdict", "details"], rows)


def _trends(s: dict) -> str:
    nights = s.get("trends") or []
    if not nights:
        return ""
    top = max(1, *(max(len(n["opened"]), len(n["closed"]), n["failing"]) for n in nights))
    w, mid, scale = 40, 90, 70 / top
    bars = []
    for i, n in enumerate(nights):
        x = 10 + i * w
        o, c = len(n["opened"]) * scale, len(n["closed"]) * scale
        bars.append(f"<rect x={x} y={mid - o:.1f} width=14 height={o:.1f} fill='#c62828'><title>{escape(n['night'])}"
                    f": {len(n['opened'])} opened</title></rect><rect x={x} y={mid} width=14 height={c:.1f} "
                    f"fill='#2e7d32'><title>{escape(n['night'])}: {len(n['closed'])} closed</title></rect>"
                    f"<circle cx={x + 7} cy={mid - n['failing'] * scale:.1f} r=3 fill='#333'><title>{n['failing']}"
                    " failing</title></circle>")
    rows = "".join(f"<tr class=night><td>{escape(n['night'])}</td><td class=n>{n['cases']}</td><td class=n>"
                   f"{n['failing']}</td><td class=n>{len(n['opened'])}</td><td class=n>{len(n['closed'])}</td></tr>"
                   for n in nights)
    return (f"<h2>Trends across nights</h2><svg width={20 + w * len(nights)} height={mid + 80} role=img>"
            f"<line x1=0 x2={20 + w * len(nights)} y1={mid} y2={mid} stroke='#999'/>{''.join(bars)}</svg>"
            "<p class=muted>Red up: buckets opened that night; green down: closed; dot: failing.</p>"
            + _table("trends", ["night", "cases", "failing", "opened", "closed"], rows))


def _findings(rows: list[dict], out: Path | None) -> str:
    if not rows:
        return "<h2>New findings</h2><p>No findings.</p>"
    body = "".join(f"<tr class=finding><td>{escape(r['property'])}</td><td>{escape(r['sut'])}</td>"
                   f"<td>{_verdict(r['verdict'])}</td><td>{escape(r['error'][:300])}</td>"
                   f"<td>{_link(r.get('replay'), out)}</td></tr>" for r in rows)
    return "<h2>New findings</h2>" + _table("findings", ["property", "SUT", "verdict", "error", "replay"], body)
