"""CSS and JavaScript of the HTML reports (:mod:`tandem_rlvr.evaluation.html`).

The script reads the chains from the ``#chain-data`` JSON element and builds every node with
``document.createElement`` and ``textContent`` (never ``innerHTML``), so model text is always text.
The view (run, filter, page, problem) lives in the URL fragment, e.g.
``report.html#run=trlvr-seed0&filter=tax&problem=test-17``, so a view can be linked and tested.
"""

CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:0;color:#222;background:#fafafa}
main{max-width:1400px;margin:0 auto;padding:1em 2em}
table{border-collapse:collapse;margin:.6em 0;font-size:13px;background:#fff}
th,td{border:1px solid #ccc;padding:3px 7px;text-align:right}th:first-child,td:first-child{text-align:left}
th{background:#eee}figure{margin:.6em 0}img{max-width:100%;border:1px solid #ddd;background:#fff}
p.item{margin:.3em 0}p.item.sub{margin-left:2em;font-size:14px}
#controls{display:flex;gap:1em;flex-wrap:wrap;align-items:center;margin:.5em 0}
#layout{display:flex;gap:1em;align-items:flex-start}
#plist{width:230px;flex:none;max-height:80vh;overflow:auto;background:#fff;border:1px solid #ccc;font-size:13px}
#plist a{display:block;padding:2px 6px;color:#124;text-decoration:none;cursor:pointer}
#plist a.sel{background:#dbe9ff}#plist .pager{padding:4px 6px;background:#eee;display:flex;gap:.5em}
#detail{flex:1;min-width:0}.question{background:#fff;border:1px solid #ccc;padding:.5em;white-space:pre-wrap}
.sample{margin:.8em 0;padding:.4em;border-top:2px solid #ddd}.pair{display:flex;gap:.8em}
.chain{flex:1;min-width:0;background:#fff;border:1px solid #ccc;padding:.4em;font-family:ui-monospace,Menlo,monospace;font-size:12px}
.chain .head{font-family:system-ui,sans-serif;font-size:13px;margin-bottom:.3em}
.body{white-space:pre-wrap;word-break:break-word}
.turn.senior{background:#cfe3ff}.turn.junior{background:#ffe2b8}
.badge{display:inline-block;padding:0 6px;border-radius:8px;color:#fff;font-size:12px;margin-left:.4em}
.badge.ok{background:#2a8a2a}.badge.bad{background:#b02a2a}
.legend span{padding:1px 6px;margin-right:.5em}.words{display:flex;gap:.8em;margin-top:.4em}
.missing{color:#b02a2a}
"""

JS = r"""
(function () {
  "use strict";
  var DATA = JSON.parse(document.getElementById("chain-data").textContent);
  var PAGE = 40;
  var FILTERS = [["all", "all samples"], ["solo_ok", "solo correct"], ["solo_bad", "solo wrong"],
                 ["team_ok", "team (step handoff) correct"], ["team_bad", "team wrong"],
                 ["tax", "solo right but team wrong"]];
  var root = document.getElementById("browser");
  function el(tag, cls, text) {
    var e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined && text !== null) e.textContent = String(text);
    return e;
  }
  function state() {
    var s = {run: "", filter: "all", page: 0, problem: ""};
    location.hash.replace(/^#/, "").split("&").forEach(function (kv) {
      var i = kv.indexOf("=");
      if (i > 0) s[decodeURIComponent(kv.slice(0, i))] = decodeURIComponent(kv.slice(i + 1));
    });
    s.page = parseInt(s.page, 10) || 0;
    return s;
  }
  function setState(s) {
    var h = ["run", "filter", "page", "problem"].map(function (k) {
      return k + "=" + encodeURIComponent(String(s[k]));
    }).join("&");
    if (location.hash !== "#" + h) location.hash = h; else render();
  }
  function byMode(p, mode) {
    var m = {};
    (p.chains[mode] || []).forEach(function (c) { m[c[0]] = c; });
    return m;
  }
  function samples(p, filter) {
    var solo = byMode(p, "solo"), team = byMode(p, "handoff"), ids = {};
    Object.keys(p.chains).forEach(function (mode) { p.chains[mode].forEach(function (c) { ids[c[0]] = 1; }); });
    return Object.keys(ids).map(Number).sort(function (a, b) { return a - b; }).filter(function (k) {
      var s = solo[k] ? solo[k][1] : null, t = team[k] ? team[k][1] : null;
      if (filter === "solo_ok") return s === 1;
      if (filter === "solo_bad") return s === 0;
      if (filter === "team_ok") return t === 1;
      if (filter === "team_bad") return t === 0;
      if (filter === "tax") return s === 1 && t === 0;
      return true;
    });
  }
  function chainCard(title, c, gold) {
    var card = el("div", "chain");
    var head = el("div", "head");
    head.appendChild(el("b", null, title));
    if (!c) { head.appendChild(el("span", null, " (not sampled)")); card.appendChild(head); return card; }
    card.setAttribute("data-correct", String(c[1]));
    head.appendChild(el("span", "badge " + (c[1] ? "ok" : "bad"), c[1] ? "correct" : "incorrect"));
    head.appendChild(el("span", null, "  graded answer: "));
    head.appendChild(el("code", null, c[2] === null ? "(none)" : c[2]));
    head.appendChild(el("span", null, "  gold: "));
    head.appendChild(el("code", null, gold));
    card.appendChild(head);
    var body = el("div", "body");
    c[3].forEach(function (t) {
      var span = el("span", "turn " + (t[0] === "s" ? "senior" : "junior"), t[1]);
      span.title = t[0] === "s" ? "senior" : "junior";
      body.appendChild(span);
    });
    card.appendChild(body);
    return card;
  }
  function legend() {
    var d = el("div", "legend");
    d.appendChild(el("span", null, "Authors:"));
    d.appendChild(el("span", "turn senior", "senior"));
    d.appendChild(el("span", "turn junior", "junior"));
    return d;
  }
  function select(id, options, value, onchange) {
    var s = el("select");
    s.id = id;
    options.forEach(function (o) {
      var opt = el("option", null, o[1]);
      opt.value = o[0];
      s.appendChild(opt);
    });
    s.value = value;
    s.addEventListener("change", function () { onchange(s.value); });
    return s;
  }
  function render() {
    var s = state();
    root.textContent = "";
    if (!DATA.runs.length) { root.appendChild(el("p", null, "No chains were saved for this report.")); finish(0); return; }
    var run = DATA.runs.filter(function (r) { return r.id === s.run; })[0] || DATA.runs[0];
    s.run = run.id;
    var matching = run.problems.filter(function (p) { return samples(p, s.filter).length > 0; });
    var controls = el("div");
    controls.id = "controls";
    controls.appendChild(el("label", null, "run "));
    controls.appendChild(select("run", DATA.runs.map(function (r) { return [r.id, r.label]; }), run.id,
      function (v) { setState({run: v, filter: s.filter, page: 0, problem: ""}); }));
    controls.appendChild(el("label", null, "show "));
    controls.appendChild(select("filter", FILTERS, s.filter,
      function (v) { setState({run: s.run, filter: v, page: 0, problem: ""}); }));
    controls.appendChild(el("span", null, matching.length + " of " + run.problems.length + " problems match"));
    controls.appendChild(legend());
    root.appendChild(controls);
    var layout = el("div");
    layout.id = "layout";
    var list = el("div");
    list.id = "plist";
    var pages = Math.max(1, Math.ceil(matching.length / PAGE));
    var pg = Math.min(Math.max(0, s.page), pages - 1);
    var pager = el("div", "pager");
    var prev = el("a", null, "‹ prev"), next = el("a", null, "next ›");
    prev.addEventListener("click", function () { setState({run: s.run, filter: s.filter, page: Math.max(0, pg - 1), problem: s.problem}); });
    next.addEventListener("click", function () { setState({run: s.run, filter: s.filter, page: Math.min(pages - 1, pg + 1), problem: s.problem}); });
    pager.appendChild(prev);
    pager.appendChild(el("span", null, "page " + (pg + 1) + "/" + pages));
    pager.appendChild(next);
    list.appendChild(pager);
    var current = matching.filter(function (p) { return p.id === s.problem; })[0] || matching[pg * PAGE];
    matching.slice(pg * PAGE, (pg + 1) * PAGE).forEach(function (p) {
      var a = el("a", p === current ? "sel" : null, p.id + " (" + samples(p, s.filter).length + ")");
      a.addEventListener("click", function () { setState({run: s.run, filter: s.filter, page: pg, problem: p.id}); });
      list.appendChild(a);
    });
    layout.appendChild(list);
    var detail = el("div");
    detail.id = "detail";
    var shown = current ? showProblem(detail, current, s.filter) : 0;
    if (!current) detail.appendChild(el("p", null, "No problem matches this filter."));
    layout.appendChild(detail);
    root.appendChild(layout);
    finish(shown);
  }
  function showProblem(detail, p, filter) {
    detail.appendChild(el("h3", null, "Problem " + p.id + " — gold answer " + p.gold));
    if (p.q) detail.appendChild(el("div", "question", p.q));
    var words = Object.keys(p.chains).filter(function (m) { return m !== "solo" && m !== "handoff"; }).sort();
    var modes = {solo: byMode(p, "solo"), handoff: byMode(p, "handoff")};
    words.forEach(function (m) { modes[m] = byMode(p, m); });
    var n = 0;
    samples(p, filter).forEach(function (k) {
      var box = el("div", "sample");
      box.appendChild(el("div", "head", "sample " + k));
      var pair = el("div", "pair");
      pair.appendChild(chainCard("solo (senior alone)", modes.solo[k], p.gold));
      pair.appendChild(chainCard("step handoff (senior + junior)", modes.handoff[k], p.gold));
      box.appendChild(pair);
      n += 2;
      var row = el("div", "words");
      words.forEach(function (m) {
        if (modes[m][k]) { row.appendChild(chainCard("word handoff, P(senior) = " + m.replace("curve-p", ""), modes[m][k], p.gold)); n += 1; }
      });
      if (row.childNodes.length) box.appendChild(row);
      detail.appendChild(box);
    });
    return n;
  }
  function finish(n) {
    document.body.setAttribute("data-chains-shown", String(n));
    document.body.setAttribute("data-ready", "1");
  }
  window.addEventListener("hashchange", render);
  render();
})();
"""
