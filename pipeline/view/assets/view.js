(function () {
  "use strict";
  // chunkyard's report. Everything from the data goes into the DOM as text (textContent,
  // attribute values of our own choosing); nothing is ever parsed as HTML.
  var META = JSON.parse(document.getElementById("cy-meta").textContent);
  var app = document.getElementById("app");
  var PAGE_CHUNKS = 200, PAGE_CHARS = 400000, TABLE_ROWS = 100, OUTLINE_MAX = 2000;
  var ATOMIC = { code: 1, table: 1, html: 1, formula: 1, image: 1 };
  var docCache = {};

  function el(tag, cls, text) {
    var e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined && text !== null) e.textContent = String(text);
    return e;
  }
  function add(parent) {
    for (var i = 1; i < arguments.length; i++) if (arguments[i]) parent.appendChild(arguments[i]);
    return parent;
  }
  function link(text, hash) { var a = el("a", null, text); a.href = hash; return a; }
  function svgEl(tag, attrs) {
    var e = document.createElementNS("http://www.w3.org/2000/svg", tag);
    for (var k in attrs) e.setAttribute(k, String(attrs[k]));
    return e;
  }
  function fmt(n) { return Number(n).toLocaleString("en-US"); }
  function clear(node) { while (node.firstChild) node.removeChild(node.firstChild); }
  function table(head, rows, numeric) {
    var t = el("table"), tr = el("tr");
    head.forEach(function (h, i) { add(tr, el("th", numeric && numeric[i] ? "num" : null, h)); });
    add(t, tr);
    rows.forEach(function (r) {
      var row = el("tr");
      r.forEach(function (v, i) {
        var td = el("td", numeric && numeric[i] ? "num" : null);
        if (v instanceof Node) td.appendChild(v); else td.textContent = v === null || v === undefined ? "" : String(v);
        row.appendChild(td);
      });
      t.appendChild(row);
    });
    return t;
  }
  function topbar(title, extra) {
    var h = el("header", "top");
    add(h, el("h1", null, title));
    (extra || []).forEach(function (x) { add(h, x); });
    return h;
  }
  function parseHash() {
    var out = {};
    location.hash.replace(/^#/, "").split("&").forEach(function (kv) {
      var i = kv.indexOf("=");
      if (i > 0) { try { out[kv.slice(0, i)] = decodeURIComponent(kv.slice(i + 1)); } catch (e) { /* a hand-typed bad escape */ } }
    });
    return out;
  }
  // Offsets are code points (as in the chunk files); JS strings count UTF-16 units, so
  // text outside the BMP (emoji, astral CJK) shifts them: map one to the other.
  function cpMap(text) {
    var astral = [], re = /[\uD800-\uDBFF][\uDC00-\uDFFF]/g, m, n = 0;
    while ((m = re.exec(text))) { astral.push(m.index - n); n++; }
    function u16(cp) {
      var lo = 0, hi = astral.length;
      while (lo < hi) { var mid = (lo + hi) >> 1; if (astral[mid] < cp) lo = mid + 1; else hi = mid; }
      return cp + lo;
    }
    return { length: text.length - astral.length, u16: astral.length ? u16 : function (cp) { return cp; } };
  }
  function loadDoc(i) {
    if (!(i in docCache)) {
      var node = document.getElementById("cy-doc-" + i);
      docCache[i] = node ? JSON.parse(node.textContent) : null;
      if (docCache[i]) docCache[i].map = cpMap(docCache[i].text);
    }
    return docCache[i];
  }

  // ---------------------------------------------------------------- text with bands
  // Cut [from, to) of `text` at every chunk and atomic-block edge; each piece is one span
  // with data-s/data-e (its offsets) and data-c (the chunks covering it).
  function bands(text, map, from, to, chunks, blocks, opts) {
    var cuts = {}, i, j;
    cuts[from] = 1; cuts[to] = 1;
    var live = [];
    for (i = 0; i < chunks.length; i++) {
      var c = chunks[i];
      if (c[1] <= from || c[0] >= to) continue;
      live.push(i);
      if (c[0] > from) cuts[c[0]] = 1;
      if (c[1] < to) cuts[c[1]] = 1;
    }
    var atoms = [];
    for (i = 0; i < blocks.length; i++) {
      var b = blocks[i];
      if (b[2] <= from || b[1] >= to) continue;
      atoms.push(b);
      if (b[1] > from) cuts[b[1]] = 1;
      if (b[2] < to) cuts[b[2]] = 1;
    }
    var pos = Object.keys(cuts).map(Number).sort(function (a, b) { return a - b; });
    var frag = document.createDocumentFragment(), spans = {};
    for (i = 0; i + 1 < pos.length; i++) {
      var s = pos[i], e = pos[i + 1], cover = [], atom = null, cls = "seg";
      for (j = 0; j < live.length; j++) {
        var ch = chunks[live[j]];
        if (ch[0] <= s && ch[1] >= e) cover.push(live[j]);
      }
      for (j = 0; j < atoms.length; j++) if (atoms[j][1] <= s && atoms[j][2] >= e) atom = atoms[j];
      var span = el("span");
      span.textContent = text.slice(map.u16(s), map.u16(e));
      span.setAttribute("data-s", s);
      span.setAttribute("data-e", e);
      if (cover.length) {
        var last = cover[cover.length - 1];
        cls += " k" + (last % 6);
        if (cover.length > 1) cls += " ov";
        for (j = 0; j < cover.length; j++) {
          if (chunks[cover[j]][0] === s) cls += " cs";
          (spans[cover[j]] = spans[cover[j]] || []).push(span);
        }
        span.setAttribute("data-c", cover.join(","));
      } else cls += " gap";
      if (atom) {
        cls += " atom";
        if (atom[1] === s) { cls += " bs"; span.setAttribute("data-label", atom[0]); }
      }
      if (opts && opts.hit && s >= opts.hit[0] && e <= opts.hit[1]) cls += " hit";
      span.className = cls;
      frag.appendChild(span);
    }
    return { frag: frag, spans: spans };
  }

  function pagesOf(doc) {
    var starts = [0], last = 0, since = 0;
    doc.chunks.forEach(function (c) {
      since++;
      if ((since > PAGE_CHUNKS || c[0] - last >= PAGE_CHARS) && c[0] > last) { starts.push(c[0]); last = c[0]; since = 1; }
    });
    starts.push(doc.map.length);
    return starts;
  }
  function atomicBlocks(doc) {
    var seen = {}, out = [];
    doc.chunks.forEach(function (c) {
      c[9].forEach(function (b) {
        var k = b.join("|");
        if (ATOMIC[b[0]] && !seen[k]) { seen[k] = 1; out.push(b); }
      });
    });
    return out;
  }

  // ---------------------------------------------------------------- document view
  function infoFor(doc, idxs, info, pinned) {
    clear(info);
    add(info, el("div", "mute", pinned ? "pinned (click the text again to unpin)" : "hover a band; click to pin"));
    var target = META.overview ? META.overview.policy.target_tokens : null;
    idxs.forEach(function (i) {
      var c = doc.chunks[i], dl = el("dl");
      var kinds = c[9].map(function (b) { return b[0] + " [" + b[1] + ", " + b[2] + ")"; });
      [["chunk", "#" + i + (idxs.length > 1 ? " (overlap)" : "")], ["id", c[3]], ["chunk_id", c[4]],
       ["offsets", "[" + c[0] + ", " + c[1] + ")"], ["lines", c[10] + "–" + c[11]],
       ["tokens", c[2] + (target ? " / " + target : "")], ["block_type", c[5]], ["blocks", kinds.join("\n")],
       ["section", c[6]], ["breadcrumb", c[7]], ["file", c[12]]].forEach(function (r) {
        add(dl, el("dt", null, r[0]), el("dd", null, r[1]));
      });
      add(info, dl, el("div", "mute", "embedText (first " + c[8].length + " chars)"), el("pre", null, c[8]));
    });
  }

  function outlineNav(doc, di) {
    var nav = el("nav", "outline");
    add(nav, el("div", "mute", "Sections"));
    var stack = [{ depth: 0, node: nav }];
    doc.outline.slice(0, OUTLINE_MAX).forEach(function (o, k) {
      while (stack.length > 1 && stack[stack.length - 1].depth >= o[1]) stack.pop();
      var next = doc.outline[k + 1], a = link(o[2] || "(untitled)", "#doc=" + di + "&at=" + o[3]);
      a.title = "section " + o[0];
      if (next && next[1] > o[1]) {
        var d = el("details"); d.open = true;
        add(d, add(el("summary"), a));
        add(stack[stack.length - 1].node, d);
        stack.push({ depth: o[1], node: d });
      } else add(stack[stack.length - 1].node, add(el("div", "leaf"), a));
    });
    if (!doc.outline.length) add(nav, el("div", "mute", "(no headings)"));
    if (doc.outline.length > OUTLINE_MAX) add(nav, el("div", "mute", "… and " + fmt(doc.outline.length - OUTLINE_MAX) + " more sections (use the pages)"));
    return nav;
  }

  var current = null; // {di, page, spans, pinned}
  function renderDoc(di, want) {
    var doc = loadDoc(di), row = META.overview.table[di];
    if (!doc) { clear(app); add(app, topbar("No such document"), link("← overview", "#")); return; }
    var pages = pagesOf(doc), page = 0, at = null;
    if (want.c !== undefined && doc.chunks[+want.c]) at = doc.chunks[+want.c][0];
    if (want.at !== undefined) at = +want.at;
    if (at !== null) { while (page + 2 < pages.length && pages[page + 1] <= at) page++; }
    else if (want.p !== undefined) page = Math.max(0, Math.min(+want.p, pages.length - 2));
    if (!current || current.di !== di || current.page !== page) drawDoc(doc, di, pages, page, row);
    if (at !== null) focusAt(at, want.c !== undefined ? +want.c : null);
  }

  function drawDoc(doc, di, pages, page, row) {
    clear(app);
    var tokens = doc.chunks.reduce(function (a, c) { return a + c[2]; }, 0);
    var extras = [link("← overview", "#"), el("span", "mute", fmt(doc.chunks.length) + " chunks · " + fmt(tokens) + " tokens · " + fmt(doc.map.length) + " chars")];
    if (di > 0) extras.push(link("‹ prev", "#doc=" + (di - 1)));
    if (di + 1 < META.overview.table.length) extras.push(link("next ›", "#doc=" + (di + 1)));
    if (doc.stale) extras.push(el("span", "warn", doc.stale + " chunk(s) no longer match the source: re-run ingest"));
    if (doc.error) extras.push(el("span", "warn", doc.error));
    add(app, topbar(doc.path, extras));
    var layout = el("div", "layout"), mid = el("div"), info = el("aside", "info");
    add(layout, outlineNav(doc, di), mid, info);
    add(app, layout);
    var legend = el("div", "mute legend");
    add(legend, el("span", "k0", "chunk"), el("span", "k1", "next chunk"), el("span", "seg ov", "overlap"),
        el("span", "seg atom", "atomic block"), el("span", "seg gap", "outside every chunk"));
    add(mid, legend);
    if (pages.length > 2) {
      var pager = el("div", "pager");
      add(pager, page > 0 ? link("‹ page " + page, "#doc=" + di + "&p=" + (page - 1)) : null,
          el("span", null, "page " + (page + 1) + " of " + (pages.length - 1) + " (chars " + fmt(pages[page]) + "–" + fmt(pages[page + 1]) + ")"),
          page + 2 < pages.length ? link("page " + (page + 2) + " ›", "#doc=" + di + "&p=" + (page + 1)) : null);
      add(mid, pager);
    }
    var box = el("div", "doctext");
    box.setAttribute("data-doc", di);
    box.setAttribute("data-from", pages[page]);
    box.setAttribute("data-to", pages[page + 1]);
    var built = bands(doc.text, doc.map, pages[page], pages[page + 1], doc.chunks, atomicBlocks(doc));
    box.appendChild(built.frag);
    add(mid, box);
    current = { di: di, page: page, spans: built.spans, pinned: null, hl: [] };
    infoFor(doc, [], info, false);
    function mark(idxs, cls, on) {
      idxs.forEach(function (i) { (current.spans[i] || []).forEach(function (s) { s.classList.toggle(cls, on); }); });
    }
    function idxsOf(t) {
      var s = t && t.closest ? t.closest(".seg[data-c]") : null;
      return s ? s.getAttribute("data-c").split(",").map(Number) : null;
    }
    box.addEventListener("mouseover", function (ev) {
      var idxs = idxsOf(ev.target);
      if (!idxs || current.pinned) return;
      mark(current.hl, "hl", false); current.hl = idxs; mark(idxs, "hl", true);
      infoFor(doc, idxs, info, false);
    });
    box.addEventListener("click", function (ev) {
      var idxs = idxsOf(ev.target);
      if (current.pinned) { mark(current.pinned, "pin", false); current.pinned = null; infoFor(doc, idxs || [], info, false); return; }
      if (!idxs) return;
      current.pinned = idxs; mark(idxs, "pin", true); infoFor(doc, idxs, info, true);
    });
  }

  function focusAt(at, chunk) {
    var segs = app.querySelectorAll(".doctext .seg");
    for (var i = 0; i < segs.length; i++) {
      var s = +segs[i].getAttribute("data-s"), e = +segs[i].getAttribute("data-e");
      if (s <= at && at < e || (s === at)) {
        segs[i].scrollIntoView({ block: "center" });
        var group = chunk !== null && current.spans[chunk] ? current.spans[chunk] : [segs[i]];
        group.forEach(function (g) { g.classList.add("target-flash"); });
        return;
      }
    }
  }

  // ---------------------------------------------------------------- overview
  function histogramSvg(h) {
    var W = 900, H = 200, pad = 44, n = h.counts.length, bw = (W - pad - 10) / n;
    var max = Math.max.apply(null, h.counts.concat([1]));
    var s = svgEl("svg", { "class": "chart", width: "100%", viewBox: "0 0 " + W + " " + (H + 40) });
    s.style.maxWidth = W + "px";
    h.counts.forEach(function (c, i) {
      var bh = c ? Math.max(1, Math.round((H - 14) * c / max)) : 0, x = pad + i * bw;
      var r = svgEl("rect", { "class": "bar" + (i >= h.target_bin ? " over" : ""), x: x + 1, y: H - bh, width: Math.max(bw - 2, 1), height: bh });
      r.setAttribute("data-count", c);
      var t = svgEl("title", {});
      t.textContent = (i < n - 1 ? (i ? h.edges[i] + 1 : 0) + "–" + h.edges[i + 1] : "> " + h.edges[i]) + " tokens: " + fmt(c) + " chunks";
      r.appendChild(t); s.appendChild(r);
      if (c) {
        var cl = svgEl("text", { x: x + bw / 2, y: H - bh - 3, "text-anchor": "middle", "class": "count" });
        cl.textContent = fmt(c); s.appendChild(cl);
      }
      if (i % 2 === 0 || i === n - 1) {
        var lab = svgEl("text", { x: x, y: H + 14, "text-anchor": "middle" });
        lab.textContent = i < n - 1 ? String(h.edges[i]) : ">" + h.edges[i]; s.appendChild(lab);
      }
    });
    var tx = pad + h.target_bin * bw;
    s.appendChild(svgEl("line", { "class": "target", x1: tx, x2: tx, y1: 0, y2: H }));
    var tl = svgEl("text", { x: tx + 4, y: 12 }); tl.textContent = "target " + h.target + " (orange: over it)"; s.appendChild(tl);
    var ml = svgEl("text", { x: pad - 6, y: 14, "text-anchor": "end" }); ml.textContent = fmt(max); s.appendChild(ml);
    var zl = svgEl("text", { x: pad - 6, y: H, "text-anchor": "end" }); zl.textContent = "0"; s.appendChild(zl);
    var xl = svgEl("text", { x: W / 2, y: H + 34, "text-anchor": "middle" }); xl.textContent = "tokens per chunk (embedText); bar height: chunks"; s.appendChild(xl);
    return s;
  }

  function chunkRows(list) {
    var T = META.overview.table;
    return list.map(function (r) {
      return [link(T[r[1]][0] + " #" + r[2], "#doc=" + r[1] + "&c=" + r[2]), r[3], fmt(r[0])].concat(r.length > 4 ? [r[4]] : []);
    });
  }

  var tableState = { filter: "", page: 0 };
  function renderOverview() {
    current = null;
    clear(app);
    var O = META.overview;
    add(app, topbar(META.title || "chunkyard report", [el("span", "mute", "chunk folder: " + (META.out || ""))]));
    var main = el("main");
    add(app, main);
    var cards = el("div", "cards");
    [["documents", O.documents], ["chunks", O.chunks], ["tokens", O.tokens], ["target tokens", O.policy.target_tokens],
     ["over target", O.over_budget_total], ["failed", O.failures.length]].forEach(function (c) {
      add(cards, add(el("div", "card"), el("b", null, fmt(c[1] || 0)), el("span", "mute", c[0])));
    });
    add(main, cards, el("h2", null, "Token sizes against the target"), histogramSvg(O.histogram));
    var grid = el("div", "grid");
    add(grid, add(el("section"), el("h2", null, "Chunk types"), table(["block_type", "chunks"], O.chunk_types.map(function (r) { return [r[0], fmt(r[1])]; }), [0, 1]),
                  el("h2", null, "Blocks inside chunks"), table(["type", "blocks"], O.block_types.map(function (r) { return [r[0], fmt(r[1])]; }), [0, 1])));
    add(grid, add(el("section"), el("h2", null, "Largest chunks"), table(["where", "id", "tokens"], chunkRows(O.largest), [0, 0, 1])));
    add(grid, add(el("section"), el("h2", null, "Smallest chunks"), table(["where", "id", "tokens"], chunkRows(O.smallest), [0, 0, 1])));
    add(main, grid);
    add(main, el("h2", null, "Chunks over the target (" + fmt(O.over_budget_total) + "; atomic blocks are never split)"));
    add(main, O.over_budget.length ? table(["where", "id", "tokens", "atomic blocks"], chunkRows(O.over_budget), [0, 0, 1, 0]) : el("div", "mute", "none"));
    add(main, el("h2", null, "Documents that failed (" + O.failures.length + ")"));
    add(main, O.failures.length ? table(["document", "why"], O.failures) : el("div", "mute", "none"));
    add(main, el("h2", null, "Documents"));
    var input = el("input"); input.type = "search"; input.placeholder = "filter by path"; input.value = tableState.filter;
    var holder = el("div");
    add(main, input, holder);
    function draw() {
      clear(holder);
      var f = tableState.filter.toLowerCase(), rows = [];
      O.table.forEach(function (r, i) { if (!f || r[0].toLowerCase().indexOf(f) >= 0) rows.push(i); });
      var pages = Math.max(1, Math.ceil(rows.length / TABLE_ROWS));
      tableState.page = Math.min(tableState.page, pages - 1);
      var shown = rows.slice(tableState.page * TABLE_ROWS, (tableState.page + 1) * TABLE_ROWS);
      var pager = el("div", "pager"), prev = el("button", null, "‹"), next = el("button", null, "›");
      prev.disabled = tableState.page === 0; next.disabled = tableState.page + 1 >= pages;
      prev.addEventListener("click", function () { tableState.page--; draw(); });
      next.addEventListener("click", function () { tableState.page++; draw(); });
      add(pager, prev, el("span", null, "page " + (tableState.page + 1) + " of " + pages + " · " + fmt(rows.length) + " documents"), next);
      add(holder, pager, table(["document", "chunks", "tokens", "notes"], shown.map(function (i) {
        var r = O.table[i];
        return [link(r[0], "#doc=" + i), fmt(r[1]), fmt(r[2]), (r[3] ? r[3] + " stale chunk(s) " : "") + (r[4] || "")];
      }), [0, 1, 1, 0]));
    }
    input.addEventListener("input", function () { tableState.filter = input.value; tableState.page = 0; draw(); });
    draw();
  }

  // ---------------------------------------------------------------- search and eval
  function payloadTable(item, skip) {
    var rows = [];
    Object.keys(item).forEach(function (k) {
      if (skip[k]) return;
      var v = item[k];
      rows.push([k, typeof v === "object" && v !== null ? JSON.stringify(v) : String(v)]);
    });
    return add(el("div", "payload"), table(["field", "value"], rows));
  }
  function contextBox(ctx) {
    var box = el("div", "doctext");
    var chunk = [[ctx.hit_start, ctx.hit_end, 0, "", "", "", "", "", "", [], 0, 0, ""]];
    var map = cpMap(ctx.text);
    box.appendChild(bands(ctx.text, map, 0, map.length, chunk.map(function (c) { return [c[0] - ctx.offset, c[1] - ctx.offset].concat(c.slice(2)); }), [],
                          { hit: [ctx.hit_start - ctx.offset, ctx.hit_end - ctx.offset] }).frag);
    box.setAttribute("data-offset", ctx.offset);
    return box;
  }
  function renderSearch() {
    clear(app);
    var R = META.record, items = R.items || [];
    var extras = [el("span", "mute", items.length + " hits")];
    ["ranker", "mode", "k", "index_hash", "embed_model", "analyzer"].forEach(function (k) {
      if (R[k] !== undefined) extras.push(el("span", "mute", k + ": " + (typeof R[k] === "object" ? JSON.stringify(R[k]) : R[k])));
    });
    add(app, topbar("Search: " + (R.query || R.text || R.q_id || ""), extras));
    var main = el("main");
    add(app, main);
    items.forEach(function (it, n) {
      var card = el("div", "hitcard");
      card.setAttribute("data-rank", n + 1);
      var ctx = META.contexts[n];
      var where = ctx ? ctx.path + " [" + ctx.hit_start + ", " + ctx.hit_end + ")" : (it.source_url || it.doc_id || "");
      add(card, add(el("div"), el("b", null, "#" + (it.k_final || n + 1) + " "), el("span", null, where),
                    el("span", "mute", "  score " + (it.score_norm !== undefined ? it.score_norm : it.score_raw !== undefined ? it.score_raw : "?") + " · section " + (it.section_id || ""))));
      if (ctx) add(card, contextBox(ctx));
      else if (it.text) add(card, el("div", "doctext", it.text));
      else add(card, el("div", "mute", "(source not available: no text to show)"));
      if (ctx && ctx.note) add(card, el("div", "warn", ctx.note));
      var d = el("details");
      add(d, el("summary", null, "citation payload"), payloadTable(it, { text: 1 }));
      add(card, d);
      add(main, card);
    });
    if (!items.length) add(main, el("div", "mute", "no hits"));
  }

  function barChart(metric, series) {
    var names = Object.keys(series).filter(function (s) { return typeof series[s][metric] === "number"; });
    var max = Math.max.apply(null, names.map(function (s) { return series[s][metric]; }).concat([1]));
    var rowH = 22, W = 420, L = 130, H = names.length * rowH + 8;
    var s = svgEl("svg", { "class": "chart", width: W, height: H, viewBox: "0 0 " + W + " " + H });
    names.forEach(function (name, i) {
      var v = series[name][metric], w = Math.round((W - L - 60) * v / max);
      var lab = svgEl("text", { x: L - 6, y: i * rowH + 15, "text-anchor": "end" }); lab.textContent = name; s.appendChild(lab);
      var r = svgEl("rect", { "class": "bar", x: L, y: i * rowH + 4, width: Math.max(w, 1), height: rowH - 8 });
      r.setAttribute("data-series", name); r.setAttribute("data-value", v); s.appendChild(r);
      var val = svgEl("text", { x: L + w + 4, y: i * rowH + 15 }); val.textContent = (Math.round(v * 1000) / 1000).toString(); s.appendChild(val);
    });
    return s;
  }
  function renderEval() {
    clear(app);
    var E = META.eval, series = E.series, metrics = E.metrics;
    add(app, topbar("Evaluation" + (E.dataset ? ": " + E.dataset : ""), [el("span", "mute", fmt(new Set(E.queries.map(function (q) { return q.id; })).size) + " questions · " + Object.keys(series).length + " run(s) in the metrics pack")]));
    var main = el("main"), grid = el("div", "grid");
    add(app, main);
    add(main, el("h2", null, "Metrics per run"));
    metrics.forEach(function (m) { add(grid, add(el("section", "metric"), el("h3", null, m), barChart(m, series))); });
    add(main, grid);
    var only = el("input"); only.type = "checkbox"; only.id = "misses";
    var lab = el("label", null, " misses only"); lab.htmlFor = "misses";
    add(main, el("h2", null, "Per question"), add(el("div"), only, lab));
    var list = el("div");
    add(main, list);
    // one box per question, one column per run (mode, chunker) in the order they come
    var order = [], byId = {};
    E.queries.forEach(function (q) {
      if (!byId[q.id]) { byId[q.id] = []; order.push(q.id); }
      byId[q.id].push(q);
    });
    function runColumn(q) {
      var col = el("div", "run");
      col.setAttribute("data-run", q.mode || "");
      var extra = [];
      if (q.first_full_hit !== undefined) extra.push("whole answer: " + (q.first_full_hit ? "rank " + q.first_full_hit : "never"));
      if (q.citation !== undefined && q.citation !== null) extra.push("citation " + (q.citation ? "verified" : "does not match the source"));
      if (q.retrieved !== undefined) extra.push(q.retrieved + " retrieved");
      add(col, el("div", "mute", q.mode || "run"), el("div", q.first_hit ? "ok" : "miss", q.first_hit ? "hit at rank " + q.first_hit : "miss"),
          extra.length ? el("div", "mute", extra.join(" · ")) : null);
      var ol = el("ol");
      (q.items || []).forEach(function (it) {
        var li = el("li", it.hit ? "ok" : null);
        add(li, el("span", null, (it.hit ? "✓ " : "✗ ") + it.path + (it.start !== null ? " [" + it.start + ", " + it.end + ")" : "")),
            el("div", "mute", it.id + (it.score !== null ? " · score " + it.score : "")));
        ol.appendChild(li);
      });
      return add(col, ol);
    }
    function draw() {
      clear(list);
      order.forEach(function (id) {
        var runs = byId[id], q = runs[0];
        if (only.checked && runs.every(function (r) { return r.first_hit; })) return;
        var box = el("div", "q");
        box.setAttribute("data-qid", id);
        add(box, add(el("div"), el("b", null, id + " "), el("span", null, q.question || "")));
        add(box, el("div", "mute", "answer: " + (q.source || "") + (q.quote ? " — “" + q.quote + "”" : q.start !== undefined ? " [" + q.start + ", " + q.end + ")" : "")));
        var cols = el("div", "runs");
        runs.forEach(function (r) { cols.appendChild(runColumn(r)); });
        add(box, cols);
        list.appendChild(box);
      });
    }
    only.addEventListener("change", draw);
    draw();
  }

  // ---------------------------------------------------------------- routing
  function route() {
    if (META.kind === "search") return renderSearch();
    if (META.kind === "eval") return renderEval();
    var h = parseHash();
    if (h.doc !== undefined) renderDoc(+h.doc, h); else renderOverview();
  }
  window.addEventListener("hashchange", route);
  route();
  document.documentElement.setAttribute("data-ready", "1");
  // for tests and scripted use: page boundaries of a document, and drawing one page
  window.chunkyardView = {
    pages: function (di) { return pagesOf(loadDoc(di)); },
    show: function (di, page) { current = null; renderDoc(di, { p: page }); }
  };
})();
