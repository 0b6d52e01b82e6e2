"""The ``--html FILE`` output: one self-contained page (inline CSS, JS and SVG; no network access).

    <header>  verdict, both models, counts, byte totals, opset/io changes
    <section id="blocks">   one collapsible <details> per MoE block: facts, shard summaries, before/after SVG
    <section id="regions">  one collapsible <details> per other changed region: before/after SVG
    <section id="nodes">    table of renamed/changed/removed/added nodes, with a filter box
    <section id="inits">    table of initializer groups

The first script records any script error into ``#script-errors`` and the page title, and the last one sets
``data-script-status="ok"`` on <body>, so a headless browser can tell that the page ran cleanly.
"""

from __future__ import annotations

import html
import json

from ndp_ep.diff.render_json import to_json_document
from ndp_ep.diff.render_text import PROVENANCE, block_headline, placement_text
from ndp_ep.diff.renderers import RenderOptions
from ndp_ep.diff.result import InitializerDiff, ModelDiff, MoEBlockDiff, Region
from ndp_ep.diff.svg import draw_region_side
from ndp_ep.text import human_bytes

FORMAT = "html"
DESCRIPTION = "one self-contained HTML page (inline CSS, JS and SVG) with collapsible blocks and before/after graphs"

MAX_HTML_REGIONS = 60
MAX_TABLE_ROWS = 2000

_CSS = """
body{font-family:system-ui,sans-serif;margin:1.5em;color:#222;max-width:1600px}
h1{font-size:1.4em;margin:0 0 .3em} h2{font-size:1.15em;margin-top:1.6em;border-bottom:1px solid #ddd}
.verdict{display:inline-block;padding:.15em .6em;border-radius:4px;color:#fff;font-weight:bold}
.verdict.equivalent{background:#1e8449}.verdict.different{background:#c0392b}
table{border-collapse:collapse;font-size:.9em;margin:.4em 0} td,th{border:1px solid #ddd;padding:.25em .5em;
text-align:left;vertical-align:top} th{background:#f6f6f6}
code{font-size:.92em} details{border:1px solid #ddd;border-radius:6px;margin:.6em 0;padding:.4em .8em}
summary{cursor:pointer;font-weight:600} .sides{display:flex;gap:1.5em;flex-wrap:wrap;align-items:flex-start}
.side{overflow:auto;max-width:100%} .side h4{margin:.4em 0;font-size:.95em;color:#555}
.st-removed{color:#c0392b}.st-added{color:#1e8449}.st-changed{color:#b7950b}.st-renamed{color:#2e61b5}
.note{color:#777;font-size:.9em} #filter{margin:.3em 0;padding:.2em .4em;width:22em}
#script-errors{color:#c0392b} .toolbar button{margin-right:.5em}
"""

_ERROR_RECORDER = """
window.addEventListener('error', function (event) {
  var box = document.getElementById('script-errors');
  var text = (event.message || 'error') + ' @' + (event.lineno || '?');
  if (box) { box.textContent += text + '\\n'; }
  document.title = 'SCRIPT ERROR: ' + text;
});
"""

_MAIN_SCRIPT = """
(function () {
  function setAll(open) {
    document.querySelectorAll('details').forEach(function (d) { d.open = open; });
  }
  document.getElementById('expand-all').addEventListener('click', function () { setAll(true); });
  document.getElementById('collapse-all').addEventListener('click', function () { setAll(false); });
  var filter = document.getElementById('filter');
  filter.addEventListener('input', function () {
    var needle = filter.value.toLowerCase();
    document.querySelectorAll('#node-table tbody tr').forEach(function (row) {
      row.style.display = row.textContent.toLowerCase().indexOf(needle) >= 0 ? '' : 'none';
    });
  });
  var data = JSON.parse(document.getElementById('diff-data').textContent);
  document.getElementById('svg-count').textContent = String(document.querySelectorAll('svg.subgraph').length);
  document.body.setAttribute('data-svg-count', String(document.querySelectorAll('svg.subgraph').length));
  document.body.setAttribute('data-equivalent', String(data.equivalent));
  document.body.setAttribute('data-script-status', 'ok');
})();
"""


def _e(value: object) -> str:
    return html.escape(str(value))


def _region_sides(region: Region) -> str:
    before = draw_region_side(region.before, f"before: {region.title}", f"arrow-a{region.index}")
    after = draw_region_side(region.after, f"after: {region.title}", f"arrow-b{region.index}")
    notes = []
    for label, side in (("before", region.before), ("after", region.after)):
        if side.omitted_nodes:
            notes.append(f"{label}: {side.omitted_nodes} more nodes not drawn")
    note = f'<p class="note">{_e("; ".join(notes))}</p>' if notes else ""
    return (
        f'<div class="sides"><div class="side"><h4>Before (A)</h4>{before}</div>'
        f'<div class="side"><h4>After (B)</h4>{after}</div></div>{note}'
    )


def _block_section(block: MoEBlockDiff, region: Region | None) -> str:
    facts = [
        ("experts", block.num_experts),
        ("top-k", block.top_k),
        ("shards", block.shards),
        ("hidden", block.hidden),
        ("ffn", block.ffn),
        ("activation", block.activation),
        ("placement", placement_text(block.placement)),
        ("replaced nodes", PROVENANCE[block.replaced_source]),
    ]
    if block.contract_error:
        facts.append(("breaks the op contract", block.contract_error))
    rows = "".join(f"<tr><th>{_e(k)}</th><td>{_e('?' if v is None else v)}</td></tr>" for k, v in facts)

    def item(i: InitializerDiff) -> str:
        return f"<li><code>{_e(i.summary)}</code> ({_e(human_bytes(i.a_bytes))} → {_e(human_bytes(i.b_bytes))})</li>"

    inits = "".join(item(i) for i in block.initializers if i.status in ("split", "merged"))
    others = [i for i in block.initializers if i.status not in ("split", "merged")]
    if others:
        inits += (
            f'<li><details class="other-inits"><summary>{len(others)} other initializers of the block '
            f"({', '.join(sorted({i.status for i in others}))})</summary><ul>{''.join(item(i) for i in others)}</ul>"
            "</details></li>"
        )
    head = f"{_e(block.block)}: {_e(block_headline(block))}"
    drawing = _region_sides(region) if region is not None else '<p class="note">no drawable region</p>'
    missing = ""
    if block.missing_replaced_nodes:
        missing = f'<p class="note">listed as replaced but absent: {_e(", ".join(block.missing_replaced_nodes))}</p>'
    return (
        f'<details class="block" open><summary>{head}</summary><table>{rows}</table>'
        f"<ul>{inits}</ul>{missing}{drawing}</details>"
    )


def script_json(document: object) -> str:
    """JSON safe inside ``<script>``: every ``<``, ``>`` and ``&`` escaped (``\\u003c``...), so no name can close
    the element or open ``<!--`` / ``<script`` (which would change how the HTML parser ends the script)."""
    text = json.dumps(document, ensure_ascii=True)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def render_html(diff: ModelDiff, json_document: dict) -> str:
    """The page; ``json_document`` (the --json document) is embedded for scripts and for download."""
    verdict = "equivalent" if diff.equivalent else "different"
    counts = "".join(f"<tr><th>{_e(k)}</th><td>{v}</td></tr>" for k, v in diff.node_counts.items())
    init_counts = "".join(
        f"<tr><th>{_e(k.replace('_', ' '))}</th><td>{v}</td></tr>" for k, v in diff.initializer_counts.items() if v
    )
    changes = [f"<li>opset {_e(o.domain)}: {_e(o.a or '∅')} → {_e(o.b or '∅')} ({o.status})</li>" for o in diff.opsets]
    changes += [
        f"<li>graph {v.kind} #{v.position} {v.status}: {_e(v.a or '∅')} → {_e(v.b or '∅')}</li>" for v in diff.values
    ]
    changes += [f"<li>function {_e(f.name)} {f.status}</li>" for f in diff.functions]
    region_by_block = {r.block: r for r in diff.regions if r.block}
    blocks = "".join(_block_section(b, region_by_block.get(b.block)) for b in diff.moe_blocks)
    other_regions = [r for r in diff.regions if r.block is None]
    region_html = "".join(
        f'<details class="region"{" open" if k < 5 else ""}><summary>Region {r.index}: {_e(r.title)} '
        f"({len(r.a_nodes)} nodes before, {len(r.b_nodes)} after)</summary>{_region_sides(r)}</details>"
        for k, r in enumerate(other_regions[:MAX_HTML_REGIONS])
    )
    if len(other_regions) > MAX_HTML_REGIONS:
        region_html += f'<p class="note">{len(other_regions) - MAX_HTML_REGIONS} more regions not drawn</p>'
    node_rows = []
    for item in diff.nodes[:MAX_TABLE_ROWS]:
        detail = "; ".join(
            f"{c.field if c.key == c.field else f'{c.field} {c.key}'}: {c.a} → {c.b}" for c in item.changes
        )
        node_rows.append(
            f'<tr><td class="st-{item.status}">{item.status}</td><td>{_e(item.a.label() if item.a else "")}</td>'
            f"<td>{_e(item.b.label() if item.b else '')}</td><td>{_e(item.match or '')}</td>"
            f"<td>{_e(item.block or '')}</td><td>{_e(detail)}</td></tr>"
        )
    init_rows = [
        f'<tr><td class="st-{i.status}">{i.status}</td><td><code>{_e(i.summary)}</code></td>'
        f"<td>{_e(human_bytes(i.a_bytes))}</td><td>{_e(human_bytes(i.b_bytes))}</td></tr>"
        for i in diff.initializers[:MAX_TABLE_ROWS]
    ]
    data = script_json(json_document)
    delta = diff.b.initializer_bytes - diff.a.initializer_bytes
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>ndp-ep diff: {verdict}</title>
<style>{_CSS}</style><script>{_ERROR_RECORDER}</script></head>
<body data-script-status="pending">
<header id="summary">
<h1>ndp-ep diff <span class="verdict {verdict}">{verdict.upper()}</span></h1>
<p>A: <code>{_e(diff.a.path)}</code> — {diff.a.node_count} nodes, {diff.a.initializer_count} initializers,
{_e(human_bytes(diff.a.initializer_bytes))}<br>B: <code>{_e(diff.b.path)}</code> — {diff.b.node_count} nodes,
{diff.b.initializer_count} initializers, {_e(human_bytes(diff.b.initializer_bytes))}
(Δ {_e(human_bytes(delta))})</p>
<div class="sides"><table><tr><th colspan="2">Nodes</th></tr>{counts}</table>
<table><tr><th colspan="2">Initializer groups</th></tr>{init_counts}</table></div>
<ul>{"".join(changes)}</ul>
<p class="note">MoE blocks: {len(diff.moe_blocks)} · changed regions: {len(diff.regions)} ·
subgraph drawings: <span id="svg-count">?</span></p>
<div class="toolbar"><button id="expand-all">Expand all</button><button id="collapse-all">Collapse all</button></div>
<pre id="script-errors"></pre>
</header>
<section id="blocks"><h2>MoE blocks ({len(diff.moe_blocks)})</h2>{blocks or '<p class="note">none</p>'}</section>
<section id="regions"><h2>Other changed regions ({len(other_regions)})</h2>
{region_html or '<p class="note">none</p>'}</section>
<section id="nodes"><h2>Nodes ({len(diff.nodes)} not unchanged)</h2>
<input id="filter" type="search" placeholder="filter rows">
<table id="node-table"><thead><tr><th>status</th><th>A</th><th>B</th><th>matched by</th><th>block</th>
<th>changes</th></tr></thead><tbody>{"".join(node_rows)}</tbody></table></section>
<section id="inits"><h2>Initializers ({len(diff.initializers)} groups)</h2>
<table><thead><tr><th>status</th><th>summary</th><th>A bytes</th><th>B bytes</th></tr></thead>
<tbody>{"".join(init_rows)}</tbody></table></section>
<script type="application/json" id="diff-data">{data}</script>
<script>{_MAIN_SCRIPT}</script>
</body></html>
"""


def render(diff: ModelDiff, options: RenderOptions) -> str:
    return render_html(diff, to_json_document(diff))
