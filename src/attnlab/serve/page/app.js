"use strict";
// The workbench page's core: the runs, the input, one column per run shown (two side by side),
// and the panels registered with attnlab.panel({...}) in panels.js. Every number a panel shows
// comes from the server's /api/views, which returns the CLI verbs' --json for the same input.
//
// A panel is {name, title, help, views, open, applies(run), live(col), params(col), init(ctx),
// render(ctx)}: `views` are the server views it reads (fetched for every edit while the panel
// is open); `render` draws them into ctx.body. See docs/serve.md, "Adding a panel".
const attnlab = (function () {
  const TOKEN = new URLSearchParams(location.search).get("token") || "";
  const $ = (id) => document.getElementById(id);
  const PANELS = [];
  const S = { runs: [], byName: {}, columns: [], input: "", maxText: 2000, updates: 0, timer: null };

  function h(tag, attrs, ...kids) {
    const el = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === undefined || v === null || v === false) continue;
      if (k === "text") el.textContent = v;
      else if (k === "class") el.className = v;
      else if (k === "style") el.style.cssText = v;
      else if (k === "data") for (const [dk, dv] of Object.entries(v)) el.dataset[dk] = dv;
      else if (k.startsWith("on")) el[k] = v;
      else el.setAttribute(k, v === true ? "" : v);
    }
    for (const kid of kids.flat()) if (kid !== null && kid !== undefined) el.append(kid);
    return el;
  }
  async function api(path, body, raw) {
    const opts = { method: body === undefined && !raw ? "GET" : "POST", headers: { "X-Attnlab-Token": TOKEN } };
    if (raw) { opts.body = raw; opts.headers["Content-Type"] = raw.type || "application/octet-stream"; }
    else if (body !== undefined) { opts.body = JSON.stringify(body); opts.headers["Content-Type"] = "application/json"; }
    let r, text;
    const t0 = performance.now();
    try { r = await fetch(path, opts); } catch (e) { throw new Error("the workbench does not answer (is attnlab serve still running?)"); }
    const t1 = performance.now();
    try { text = await r.text(); } catch (e) { text = ""; }
    const t2 = performance.now();
    let d = null;
    try { d = JSON.parse(text); } catch (e) { d = null; }
    api.last = { wait: t1 - t0, read: t2 - t1, parse: performance.now() - t2, bytes: text.length };  // where an edit's time goes
    if (!r.ok) throw new Error((d && d.error) || ("the server answered " + r.status));
    return d;
  }
  function message(text) { $("message").textContent = text || ""; $("message").hidden = !text; }

  // -- formatting shared by the panels ----------------------------------------------------------
  function show(t) {  // a token made visible: a space as ␣, a newline as ↵, the empty token as ∅
    t = String(t);
    if (t === "") return "\u2205";
    return t.replace(/ /g, "\u2423").replace(/\n/g, "\u21b5").replace(/\t/g, "\u21e5");
  }
  function num(x, d) {  // a number as the page shows it: d decimals (4 unless said)
    if (x === null || x === undefined) return "-";
    if (typeof x !== "number") return String(x);
    return x.toFixed(d === undefined ? 4 : d);
  }
  // The colour scales as [r, g, b] (what a canvas's pixels take) and as CSS text.
  function colourRGB(w) {  // 0 white -> 1 blue (the explorer's scale)
    const a = Math.max(0, Math.min(1, w));
    return [Math.round(255 - 224 * a), Math.round(255 - 136 * a), Math.round(255 - 75 * a)];
  }
  function divergingRGB(v, top) {  // negative orange, positive blue
    const a = Math.max(-1, Math.min(1, v / (top || 1)));
    return a >= 0 ? colourRGB(a) : [255, Math.round(255 + 128 * a), Math.round(255 + 241 * a)];
  }
  const css = (c) => "rgb(" + c[0] + "," + c[1] + "," + c[2] + ")";
  function colour(w) { return css(colourRGB(w)); }
  function diverging(v, top) { return css(divergingRGB(v, top)); }
  // Cells of `rows` x `cols`, each `px` pixels square, into a canvas at (x0, y0): one pixel a
  // cell in a buffer, then scaled up without smoothing (one fillRect per cell, its colour parsed
  // from text each time, took most of an edit's drawing at 64 tokens). rgb(i, j) gives a
  // cell's [r, g, b].
  function paintCells(x, x0, y0, rows, cols, px, rgb) {
    if (!rows || !cols) return;
    const img = x.createImageData(cols, rows), d = img.data;
    for (let i = 0, o = 0; i < rows; i++) for (let j = 0; j < cols; j++, o += 4) {
      const c = rgb(i, j);
      d[o] = c[0]; d[o + 1] = c[1]; d[o + 2] = c[2]; d[o + 3] = 255;
    }
    if (px === 1) { x.putImageData(img, x0, y0); return; }
    const small = document.createElement("canvas");
    small.width = cols; small.height = rows;
    small.getContext("2d").putImageData(img, 0, 0);
    const smooth = x.imageSmoothingEnabled;
    x.imageSmoothingEnabled = false;
    x.drawImage(small, x0, y0, cols * px, rows * px);
    x.imageSmoothingEnabled = smooth;
  }
  function tip(e, text) {
    const t = $("tip");
    if (!e) { t.style.display = "none"; return; }
    t.textContent = text; t.style.display = "block";
    t.style.left = (e.clientX + 12) + "px"; t.style.top = (e.clientY + 12) + "px";
  }
  // A matrix as a coloured table: rows x cols of numbers, labels on both sides; the numbers are
  // written in the cells (d decimals) up to `textMax` columns, and in each cell's title always.
  function heat(M, rows, cols, opts) {
    opts = opts || {};
    const d = opts.decimals === undefined ? 3 : opts.decimals, textMax = opts.textMax || 32;
    let top = opts.top;
    if (top === undefined) { top = 1e-12; for (const r of M) for (const v of r) if (v !== null && Math.abs(v) > top) top = Math.abs(v); }
    const fillRGB = (v) => (v === null ? GREY : opts.signed ? divergingRGB(v, top) : colourRGB(v / top));
    const fill = (v) => css(fillRGB(v));
    if (M.length && M[0].length > textMax) return heatCanvas(M, rows, cols, fillRGB, opts);
    const t = h("table", { class: "heat" });
    if (cols) t.append(h("tr", {}, h("th"), cols.map((c) => h("th", { text: show(c).slice(0, 8) }))));
    M.forEach((r, i) => {
      const tr = h("tr", {}, h("th", { text: rows ? show(rows[i]).slice(0, 12) : String(i) }));
      r.forEach((v, j) => {
        const td = h("td", { class: "cell", title: (rows ? show(rows[i]) : i) + " \u2192 " + (cols ? show(cols[j]) : j) + ": " + num(v, 6),
          style: "background:" + fill(v), data: { i: i, j: j, v: v === null ? "" : v } });
        if (r.length <= textMax && v !== null) td.textContent = num(v, d);
        if (opts.onclick) td.onclick = () => opts.onclick(i, j);
        tr.append(td);
      });
      t.append(tr);
    });
    return t;
  }
  // A matrix too wide to write its numbers in: drawn on a canvas, each number on hover.
  const GREY = [228, 228, 228];  // a cell with no number (masked)
  function heatCanvas(M, rows, cols, fillRGB, opts) {
    const cell = Math.max(3, Math.min(12, Math.floor(640 / M[0].length))), pad = 64;
    const c = h("canvas", { class: "heat", width: pad + cell * M[0].length + 2, height: pad + cell * M.length + 2 });
    const x = c.getContext("2d");
    x.fillStyle = "#fff"; x.fillRect(0, 0, c.width, c.height);
    paintCells(x, pad, pad, M.length, M[0].length, cell, (i, j) => fillRGB(M[i][j]));
    if (cell >= 8) {
      x.font = "9px monospace"; x.fillStyle = "#222"; x.textAlign = "right";
      if (rows) rows.forEach((t, i) => x.fillText(show(t).slice(0, 8), pad - 3, pad + i * cell + cell - 1));
      if (cols) cols.forEach((t, j) => { x.save(); x.translate(pad + j * cell + cell - 2, pad - 3); x.rotate(-Math.PI / 2); x.textAlign = "left"; x.fillText(show(t).slice(0, 8), 0, 0); x.restore(); });
    }
    const at = (e) => { const b = c.getBoundingClientRect(); return [Math.floor((e.clientY - b.top - pad) / cell), Math.floor((e.clientX - b.left - pad) / cell)]; };
    c.onmousemove = (e) => {
      const [i, j] = at(e);
      if (i >= 0 && j >= 0 && i < M.length && j < M[0].length) tip(e, (rows ? show(rows[i]) : i) + " \u2192 " + (cols ? show(cols[j]) : j) + ": " + num(M[i][j], 4));
      else tip(null);
    };
    c.onmouseleave = () => tip(null);
    if (opts.onclick) c.onclick = (e) => { const [i, j] = at(e); if (i >= 0 && j >= 0 && i < M.length && j < M[0].length) opts.onclick(i, j); };
    return c;
  }
  function bars(items, label, value, opts) {  // label / value: field names; bars scaled to the largest
    opts = opts || {};
    const top = Math.max(1e-12, ...items.map((x) => Math.abs(x[value])));
    return h("div", { class: "bars" }, items.map((x) => h("div", { class: "item", data: { label: x[label], v: x[value] } },
      h("span", { class: "lab", text: show(x[label]) }),
      h("span", { class: "pbar" + (x[value] < 0 ? " neg" : ""), style: "width:" + Math.round(160 * Math.abs(x[value]) / top) + "px" }),
      h("span", { class: "num", text: num(x[value], opts.decimals) }))));
  }

  // -- runs and columns ---------------------------------------------------------------------------
  function panel(def) { PANELS.push(def); }

  class Column {
    constructor(name) {
      this.name = name; this.run = S.byName[name]; this.data = {}; this.errors = {}; this.message = "";
      this.seq = 0; this.busy = false; this.again = false;
      this.sel = { map: 0, head: 0 };  // the selected attention map and head (every panel reads it)
      this.params = {};  // panel -> params it adds to the request (an ablation's head, a DLA target)
      this.el = h("section", { class: "column", data: { run: name } });
      const r = this.run;
      this.el.append(h("div", { class: "colhead" }, name + " ", h("span", { class: "about", text: r.description ? "\u2014 " + r.description : "" })));
      this.panels = [];
      for (const def of PANELS) {
        if (def.applies && !def.applies(r)) continue;
        const sec = h("section", { class: "panel" + (def.open === false ? " closed" : ""), data: { panel: def.name } });
        const head = h("header", {}, h("h2", { text: def.title }), " ", h("small", { text: def.help || "" }));
        const body = h("div", { class: "body" }), perr = h("div", { class: "perr" });
        sec.append(head, perr, body);
        const ctx = { col: this, def: def, sec: sec, body: body, perr: perr, state: {} };
        head.onclick = () => { sec.classList.toggle("closed"); if (!sec.classList.contains("closed")) this.update(); };
        this.panels.push(ctx);
        this.el.append(sec);
        if (def.init) def.init(ctx);
      }
    }
    open(ctx) { return !ctx.sec.classList.contains("closed"); }
    liveViews() {  // the views the open panels read on every edit
      const out = new Set();
      for (const p of this.panels) {
        if (!this.open(p)) continue;
        const v = typeof p.def.views === "function" ? p.def.views(p) : p.def.views || [];
        v.forEach((x) => out.add(x));
      }
      return Array.from(out);
    }
    requestParams() {
      const m = this.data.explorer && this.data.explorer.maps ? this.data.explorer.maps[this.sel.map] : null;
      const p = { layer: m ? m.layer : 0, head: Math.max(0, this.sel.head) };
      for (const ctx of this.panels) if (ctx.def.params && this.open(ctx)) Object.assign(p, ctx.def.params(ctx) || {});
      return p;
    }
    // Fetch `views` (default: every open panel's) for the current input and redraw. Only one
    // request per column is in flight; an edit made meanwhile is sent when it returns.
    async update(views) {
      if (this.busy) { this.again = true; return; }
      const input = S.input;
      views = views || this.liveViews();
      if (!views.length) { done(); return; }
      this.busy = true;
      const seq = ++this.seq;
      try {
        const d = await api("/api/views", { run: this.name, input: input, views: views, params: this.requestParams() });
        this.fetchMs = api.last;
        if (seq !== this.seq) return;
        const errors = {};
        for (const [k, v] of Object.entries(d.views)) {
          if (v && v.serve_error !== undefined) errors[k] = v.serve_error; else this.data[k] = v;
          if (errors[k] === undefined) delete this.errors[k]; else this.errors[k] = errors[k];
        }
        const lines = Object.values(errors);
        // one line, once: an input every view refuses (a character the vocabulary lacks)
        const same = lines.length === views.length && lines.every((x) => x === lines[0]);
        this.message = same ? lines[0] : "";
        this.input = input;
        this.draw(views, same);
      } catch (e) {
        this.message = e.message;
        this.panels.forEach((p) => p.sec.classList.add("stale"));
      } finally {
        this.busy = false;
        showMessages();
        if (this.again) { this.again = false; this.update(); } else done();
      }
    }
    draw(views, allFailed) {
      const ms = {};
      for (const p of this.panels) {
        const used = typeof p.def.views === "function" ? p.def.views(p) : p.def.views || [];
        if (!this.open(p) || !used.some((v) => views.includes(v))) continue;
        const err = used.map((v) => this.errors[v]).find((x) => x);
        p.sec.classList.toggle("stale", !!err);
        p.perr.textContent = err && !allFailed ? err : "";
        if (!err) {
          const t0 = performance.now();
          try { p.def.render(p); } catch (e) { p.perr.textContent = "could not draw: " + e.message; console.error(e); }
          ms[p.def.name] = performance.now() - t0;
        }
      }
      this.drawMs = ms;
    }
    redraw() { this.draw(this.liveViews(), false); }
    select(map, head) {  // a head picked in the grid: every panel that reads the selection follows
      this.sel.map = map; this.sel.head = head;
      this.redraw();
      if (this.liveViews().includes("trace")) this.update(["trace"]);
    }
  }

  function showMessages() {
    const lines = S.columns.filter((c) => c.message).map((c) => (S.columns.length > 1 ? c.name + ": " : "") + c.message);
    message(lines.join("\n"));
  }
  function done() {
    if (S.columns.some((c) => c.busy)) return;
    S.updates++;
    document.body.dataset.updates = String(S.updates);
    document.body.dataset.done = S.input;
    document.body.dataset.ms = (performance.now() - (S.t0 || 0)).toFixed(1);  // edit -> every panel drawn
    document.body.dataset.timing = JSON.stringify(S.columns.map((c) => ({ fetch: c.fetchMs, draw: c.drawMs })));
    // and once the browser has laid it out and painted it (the frame after the drawing)
    const t0 = S.t0 || 0, input = S.input;
    requestAnimationFrame(() => setTimeout(() => {
      if (S.input !== input) return;
      document.body.dataset.painted = (performance.now() - t0).toFixed(1);
      document.dispatchEvent(new CustomEvent("attnlab-painted", { detail: input }));
    }, 0));
    $("status").textContent = "updated";
  }

  function setColumns() {
    const names = [$("run-a").value, $("run-b").value].filter((x, i) => x && (i === 0 || x !== $("run-a").value));
    S.columns = names.map((n) => new Column(n));
    const main = $("columns");
    main.innerHTML = "";
    main.classList.toggle("two", S.columns.length > 1);
    S.columns.forEach((c) => main.append(c.el));
    const r = S.columns.length ? S.columns[0].run : null;
    const reads = r ? r.reads : "text";
    $("input-label").textContent = reads === "source" ? "source" : reads === "image" ? "image" : "text";
    $("imagepick").hidden = reads !== "image";
    $("text").hidden = reads === "image";
    if (reads === "image" && !/^(test|upload):/.test(S.input)) setInput("test:" + ($("testn").value || 0));
    else if (reads !== "image" && /^(test|upload):/.test(S.input)) { $("text").value = "I like to eat apples"; setInput($("text").value); }
    else refresh();
  }
  function setInput(v) {
    S.input = v; S.t0 = performance.now();
    if (!$("text").hidden) $("text").value = v;
    refresh();
  }
  function refresh() {
    const n = S.input.length;
    $("count").textContent = n + " / " + S.maxText + " characters";
    if (n > S.maxText) { message("the input is " + n + " characters; this workbench takes at most " + S.maxText); return; }
    $("status").textContent = "updating\u2026";
    delete document.body.dataset.done;
    S.columns.forEach((c) => c.update());
  }

  function runsTable() {
    const t = $("runs");
    t.innerHTML = "";
    t.append(h("tr", {}, ["run", "kind", "parameters", "weights", "task", "trained on", "model"].map((x) => h("th", { text: x }))));
    for (const r of S.runs) {
      if (r.error) { t.append(h("tr", {}, h("td", { text: r.name }), h("td", { class: "bad", colspan: 6, text: r.error }))); continue; }
      t.append(h("tr", { class: "pick", onclick: () => { $("run-a").value = r.name; setColumns(); } },
        h("td", { text: r.name }), h("td", { text: r.kind }), h("td", { text: r.parameters.toLocaleString("en") }),
        h("td", { text: (r.bytes / 1048576).toFixed(2) + " MiB" }), h("td", { text: r.task || "-" }),
        h("td", { text: r.data || "-" }), h("td", { text: r.description })));
    }
  }

  async function start() {
    let d;
    try { d = await api("/api/runs"); } catch (e) { message(e.message); return; }
    S.runs = d.runs; S.maxText = d.max_text;
    S.runs.forEach((r) => { S.byName[r.name] = r; });
    const ok = S.runs.filter((r) => !r.error);
    const bad = S.runs.filter((r) => r.error);
    for (const r of ok) { $("run-a").add(new Option(r.name + " (" + r.kind + ")", r.name)); $("run-b").add(new Option(r.name + " (" + r.kind + ")", r.name)); }
    runsTable();
    if (bad.length) message(bad.map((r) => r.name + ": " + r.error).join("\n"));
    $("show-runs").onclick = () => { $("runs").hidden = !$("runs").hidden; };
    $("run-a").onchange = setColumns;
    $("run-b").onchange = setColumns;
    $("text").oninput = () => setInput($("text").value);  // every edit; a column sends the latest when free
    $("testn").oninput = () => setInput("test:" + $("testn").value);
    $("file").onchange = () => { if ($("file").files[0]) upload($("file").files[0]); };
    const bar = $("inputbar");
    bar.ondragover = (e) => { e.preventDefault(); bar.classList.add("drop"); };
    bar.ondragleave = () => bar.classList.remove("drop");
    bar.ondrop = (e) => { e.preventDefault(); bar.classList.remove("drop"); if (e.dataTransfer.files[0]) upload(e.dataTransfer.files[0]); };
    if (!ok.length) { $("status").textContent = "no run can be opened"; return; }
    S.input = $("text").value;
    setColumns();
  }
  async function upload(file) {
    try { const d = await api("/api/image", undefined, file); setInput(d.image); }
    catch (e) { message(e.message); }
  }

  window.addEventListener("DOMContentLoaded", start);
  return { panel, h, api, show, num, colour, colourRGB, diverging, paintCells, heat, bars, tip, state: S, columns: () => S.columns, setInput, message };
})();
