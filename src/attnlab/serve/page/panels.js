"use strict";
// The workbench's panels, top to bottom. Each draws the JSON of the server views it names (the
// CLI verbs' --json for the same input); a new panel is one attnlab.panel({...}) call here and,
// if it needs data no view gives yet, one @view function in attnlab/serve/views.py.
(function () {
  const { panel, h, api, show, num, colour, colourRGB, paintCells, heat, bars, tip } = attnlab;

  // -- attention maps as the explorer carries them (attnlab explore's data) --------------------
  // Weights are either stored (thousandths) or derived, as the model computes them, from the
  // recorded q and k: softmax of q.k/sqrt(d_k) over the keys each query may see.
  function maps(col) { return col.data.explorer ? col.data.explorer.maps : []; }
  function cacheOf(col) {
    const D = col.data.explorer;
    if (!col._cache || col._cache.D !== D) col._cache = { D: D, w: {}, s: {}, sees: {}, qk: {} };
    return col._cache;
  }
  function f32(b64) {
    const s = atob(b64), dv = new DataView(new ArrayBuffer(s.length));
    for (let i = 0; i < s.length; i++) dv.setUint8(i, s.charCodeAt(i));
    const out = new Float64Array(s.length >> 2);
    for (let i = 0; i < out.length; i++) out[i] = dv.getFloat32(4 * i, true);
    return out;
  }
  function neuronOf(col, mi) { const n = maps(col)[mi].neuron; return n && !n.why ? n : null; }
  function qk(col, mi, h) {
    const C = cacheOf(col), key = mi + "/" + h, n = maps(col)[mi].neuron;
    if (!C.qk[key]) C.qk[key] = { q: f32(n.q[h]), k: f32(n.k[Math.floor(h / n.group)]) };
    return C.qk[key];
  }
  function seesOf(col, mi) {
    const C = cacheOf(col);
    if (!C.sees[mi]) {
      const m = maps(col)[mi], s = atob(m.neuron.sees), out = new Uint8Array(m.T * m.S);
      for (let x = 0; x < out.length; x++) out[x] = (s.charCodeAt(x >> 3) >> (7 - (x & 7))) & 1;
      C.sees[mi] = out;
    }
    return C.sees[mi];
  }
  function scoresOf(col, mi, h) {  // (T*S) q_i.k_j summed over d in order, times 1/sqrt(d_k)
    const C = cacheOf(col), key = mi + "/" + h, m = maps(col)[mi], n = m.neuron;
    if (C.s[key]) return C.s[key];
    const out = new Float64Array(m.T * m.S);
    if (h >= 0) {
      const V = qk(col, mi, h), d = n.D;
      for (let i = 0; i < m.T; i++) for (let j = 0; j < m.S; j++) {
        let sum = 0;
        for (let x = 0, a = i * d, b = j * d; x < d; x++) sum += V.q[a + x] * V.k[b + x];
        out[i * m.S + j] = sum * n.scale;
      }
    } else for (let hh = 0; hh < m.H; hh++) { const src = scoresOf(col, mi, hh); for (let x = 0; x < out.length; x++) out[x] += src[x] / m.H; }
    return (C.s[key] = out);
  }
  function weights(col, mi, h) {  // (T*S) floats; h = -1: the mean over heads
    const C = cacheOf(col), key = mi + "/" + h, m = maps(col)[mi];
    if (C.w[key]) return C.w[key];
    const out = new Float64Array(m.T * m.S);
    if (h < 0) { for (let hh = 0; hh < m.H; hh++) { const src = weights(col, mi, hh); for (let x = 0; x < out.length; x++) out[x] += src[x] / m.H; } }
    else if (m.w) { for (let x = 0; x < out.length; x++) out[x] = m.w[h][x] / col.data.explorer.scale; }
    else {
      const sc = scoresOf(col, mi, h), ok = seesOf(col, mi);
      for (let i = 0, r = 0; i < m.T; i++, r += m.S) {
        let top = -Infinity, z = 0;
        for (let j = 0; j < m.S; j++) if (ok[r + j] && sc[r + j] > top) top = sc[r + j];
        for (let j = 0; j < m.S; j++) if (ok[r + j]) { out[r + j] = Math.exp(sc[r + j] - top); z += out[r + j]; }
        if (z > 0) for (let j = 0; j < m.S; j++) out[r + j] /= z;
      }
    }
    return (C.w[key] = out);
  }
  function qTokens(col, m) { return col.data.explorer.stacks[m.qstack].tokens; }
  function kTokens(col, m) { return col.data.explorer.stacks[m.kstack].tokens; }
  function rowsOf(W, m) { const M = []; for (let i = 0; i < m.T; i++) M.push(Array.from(W.slice(i * m.S, (i + 1) * m.S))); return M; }
  function headLabel(col, mi, h) {
    const m = maps(col)[mi], labels = col.data.explorer.heads || {};
    return labels[m.name] ? labels[m.name][h] : null;
  }

  // -- prediction -----------------------------------------------------------------------------
  panel({
    name: "prediction", title: "prediction", help: "what the model outputs for this input (attnlab predict --json)",
    views: ["predict"],
    applies: (r) => r.task !== null || r.kind !== "encoder",
    render(ctx) {
      const p = ctx.col.data.predict.predictions[0], b = ctx.body;
      b.innerHTML = "";
      if (p.output !== undefined) b.append(h("div", { class: "output", text: p.output, data: { output: p.output } }));
      if (p.next) b.append(h("h3", { text: "next token after \u2026" + show(ctx.col.input.slice(-12)) }), bars(p.next, "token", "p"));
      if (p.masks) p.masks.forEach((f) => b.append(h("h3", { text: "[MASK] at position " + f[0].position }), bars(f, "token", "p")));
      if (p.classes) {
        if (p.truth !== undefined && p.truth !== null) b.append(h("div", { class: "help", text: "true class: " + p.truth }));
        b.append(bars(p.classes, "label", "p"));
      }
      const ex = ctx.col.data.explorer;  // an encoder-decoder: each decoder step's next token
      if (ex && ex.prediction && p.output !== undefined) {
        const steps = ex.prediction.sections.filter((s) => s.title.startsWith("step "));
        if (steps.length) b.append(h("div", { class: "help", text: steps.length + " decoder steps; the attention panel's cross-attention shows where each looked" }));
      }
    },
  });

  // -- attention: every layer x head, one head large, the Q·K neuron view ----------------------
  panel({
    name: "attention", title: "attention", help: "every layer \u00d7 head (click one: it is selected and ablated below); the selected head as lines and as its matrix; the Q\u00b7K neuron view (attnlab explore's data)",
    views: ["explorer"],
    init(ctx) {
      ctx.state.mode = "w";
      const st = ctx.state;
      st.map = h("select"); st.head = h("select");
      st.modeSel = h("select", {}, h("option", { value: "w", text: "attention weights" }), h("option", { value: "s", text: "scaled scores q\u00b7k/\u221ad_k" }));
      st.map.onchange = () => { ctx.col.select(+st.map.value, Math.min(ctx.col.sel.head, maps(ctx.col)[+st.map.value].H - 1)); };
      st.head.onchange = () => ctx.col.select(ctx.col.sel.map, +st.head.value);
      st.modeSel.onchange = () => { st.mode = st.modeSel.value; ctx.def.render(ctx); };
      st.status = h("span", { class: "status" });
      st.controls = h("div", { class: "controls" }, h("label", {}, "attention ", st.map), h("label", {}, "head ", st.head), h("label", {}, "matrix shows ", st.modeSel), st.status);
      st.grid = h("div", { class: "grid" }); st.lines = h("canvas"); st.matrix = h("div"); st.cell = h("div", { class: "help" });
      st.image = h("canvas"); st.neuron = h("div");
      st.imagebox = h("div", { hidden: true }, h("h3", { text: "image: where the query looks (hover a query token on the left of the lines)" }), st.image);
      ctx.body.append(st.controls,
        h("h3", { text: "model view: every layer \u00d7 head (each from white 0 to blue, its own largest weight)" }), st.grid,
        h("div", { class: "row" },
          h("div", {}, h("h3", { text: "head view (hover a token)" }), st.lines),
          h("div", {}, h("h3", { text: "matrix: row = query, column = key" }), st.matrix, st.cell), st.imagebox),
        h("h3", { text: "Q\u00b7K neuron view: how the head scores every key for one query, dimension by dimension" }), st.neuron);
      st.nq = null; st.nk = null; st.hover = null;
    },
    render(ctx) {
      const col = ctx.col, st = ctx.state, D = col.data.explorer;
      if (!D.maps.length) { st.status.textContent = "no attention maps"; return; }
      if (col.sel.map >= D.maps.length) col.sel.map = 0;
      const mi = col.sel.map, m = D.maps[mi];
      if (col.sel.head >= m.H) col.sel.head = 0;
      st.map.innerHTML = ""; D.maps.forEach((x, i) => st.map.add(new Option(x.label, String(i))));
      st.map.value = String(mi);
      st.head.innerHTML = ""; for (let x = 0; x < m.H; x++) st.head.add(new Option("head " + x, String(x)));
      if (m.H > 1) st.head.add(new Option("mean of heads", "-1"));
      st.head.value = String(col.sel.head);
      st.modeSel.disabled = !neuronOf(col, mi);
      if (!neuronOf(col, mi)) st.mode = "w";
      if (st.nq === null || st.nq >= m.T || st.lastMap !== mi) { st.nq = m.T - 1; st.nk = null; }
      st.lastMap = mi;
      st.status.textContent = m.name + (col.sel.head < 0 ? " (mean)" : " head " + col.sel.head) + "  " + m.T + " \u00d7 " + m.S + (D.note ? "  \u2014 " + D.note : "");
      drawGrid(ctx); drawLines(ctx); drawMatrix(ctx); drawNeuron(ctx); drawImage(ctx);
    },
  });

  // Every layer x head on one canvas (each canvas the page changes costs the browser a frame of
  // its own: sixteen of them were a third of an edit's drawing), with one transparent box per
  // head over it that carries the head's name, its click and its selected / ablated border.
  function drawGrid(ctx) {
    const col = ctx.col, D = col.data.explorer, st = ctx.state, g = st.grid;
    const H = Math.max(...D.maps.map((m) => m.H)), ablated = col.params.ablate, GAP = 3, B = 2;
    const px = (m) => Math.max(1, Math.floor(56 / Math.max(m.T, m.S)));
    const cw = (m) => Math.max(40, px(m) * m.S), ch = (m) => Math.max(1, Math.round(cw(m) * m.T / m.S));
    const pitch = Math.max(...D.maps.map(cw)) + 2 * B + GAP;
    const c = document.createElement("canvas"), x = c.getContext("2d"), font = "11px system-ui, sans-serif";
    x.font = font;
    const labW = Math.ceil(Math.max(0, ...D.maps.map((m) => x.measureText(m.label).width))) + 10;
    const top = []; let y = 0;
    D.maps.forEach((m) => { top.push(y); y += ch(m) + 2 * B + GAP; });
    c.width = labW + H * pitch; c.height = Math.max(1, y - GAP);
    x.font = font; x.fillStyle = "#444"; x.textAlign = "right"; x.textBaseline = "middle";
    x.imageSmoothingEnabled = false;
    const scratch = st.scratch || (st.scratch = document.createElement("canvas")), sx = scratch.getContext("2d");
    const key = D.maps.map((m) => [m.name, m.label, m.T, m.S, m.H].join("/")).join("|");
    const same = st.gridKey === key && st.gridCells;
    if (!same) { g.innerHTML = ""; st.gridCells = D.maps.map(() => []); st.gridKey = key; st.gridCanvas = null; }
    D.maps.forEach((m, mi) => {
      x.fillText(m.label, labW - 6, top[mi] + B + ch(m) / 2);
      for (let hh = 0; hh < m.H; hh++) {
        const W = weights(col, mi, hh), lab = headLabel(col, mi, hh);
        let most = 1e-9; for (const v of W) if (v > most) most = v;
        scratch.width = m.S; scratch.height = m.T;
        paintCells(sx, 0, 0, m.T, m.S, 1, (i, j) => colourRGB(W[i * m.S + j] / most));
        x.drawImage(scratch, labW + hh * pitch + B, top[mi] + B, cw(m), ch(m));
        let box = st.gridCells[mi][hh];
        if (!box) {
          box = h("div", { class: "gcell", style: "left:" + (labW + hh * pitch) + "px;top:" + top[mi] + "px;width:" + (cw(m) + 2 * B) + "px;height:" + (ch(m) + 2 * B) + "px" });
          st.gridCells[mi][hh] = box; g.append(box);
        }
        box.title = m.label + " head " + hh + (lab ? " (ablate " + lab + ")" : "");
        box.dataset.map = mi; box.dataset.head = hh; box.dataset.label = lab || "";
        box.classList.toggle("sel", mi === col.sel.map && hh === col.sel.head);
        box.classList.toggle("ablated", !!(ablated && ablated.head === lab));
        box.onclick = () => { col.select(mi, hh); if (lab) attnlab.ablate(col, lab); };
      }
    });
    if (st.gridCanvas) st.gridCanvas.replaceWith(c); else g.prepend(c);
    st.gridCanvas = c;
  }

  const LINE = 16;
  function drawLines(ctx) {
    const col = ctx.col, st = ctx.state, mi = col.sel.map, m = maps(col)[mi];
    const q = qTokens(col, m), k = kTokens(col, m), W = weights(col, mi, col.sel.head);
    // drawn on a new canvas, put in place when done: a canvas in the page brings the page's
    // style up to date at each fillText (a canvas outside it has no style to bring up)
    const c = h("canvas"), x = c.getContext("2d"), rows = Math.max(m.T, m.S);
    c.width = 360; c.height = Math.min(rows, 200) * LINE + 28;
    x.fillStyle = "#fff"; x.fillRect(0, 0, c.width, c.height);
    x.font = "12px monospace"; x.fillStyle = "#555";
    x.textAlign = "right"; x.fillText(m.qstack ? "queries (" + m.qstack + ")" : "queries", 130, 12);
    x.textAlign = "left"; x.fillText(m.kstack ? "keys (" + m.kstack + ")" : "keys", 230, 12);
    const y = (i) => 28 + i * LINE - 4, hv = st.hover;
    // one path per opacity (in hundredths): a few dozen strokes, not one per query-key pair
    const paths = new Map();
    for (let i = 0; i < m.T; i++) for (let j = 0; j < m.S; j++) {
      const w = W[i * m.S + j];
      if (w <= 0.004) continue;
      if (hv && !((hv.side === "q" && hv.i === i) || (hv.side === "k" && hv.i === j))) continue;
      const a = Math.max(1, Math.round(100 * (hv ? w : 0.85 * w)));
      if (!paths.has(a)) paths.set(a, new Path2D());
      const p = paths.get(a); p.moveTo(136, y(i)); p.lineTo(224, y(j));
    }
    x.lineWidth = hv ? 2.5 : 1.5;
    for (const [a, p] of paths) { x.strokeStyle = "rgba(31,119,180," + (a / 100).toFixed(2) + ")"; x.stroke(p); }
    x.fillStyle = "#222";
    x.textAlign = "right"; q.forEach((t, i) => x.fillText(show(t).slice(0, 14), 128, y(i)));
    x.textAlign = "left"; k.forEach((t, j) => x.fillText(show(t).slice(0, 14), 232, y(j)));
    c.onmousemove = (e) => {
      const r = c.getBoundingClientRect(), i = Math.floor((e.clientY - r.top - 28 + 4 + 11) / LINE);
      const side = e.clientX - r.left < c.width / 2 ? "q" : "k", n = side === "q" ? m.T : m.S;
      const hv2 = i >= 0 && i < n ? { side: side, i: i } : null;
      if (JSON.stringify(hv2) !== JSON.stringify(st.hover)) { st.hover = hv2; drawLines(ctx); drawImage(ctx); }
    };
    c.onmouseleave = () => { st.hover = null; drawLines(ctx); };
    st.lines.replaceWith(c); st.lines = c;
  }

  function drawMatrix(ctx) {
    const col = ctx.col, st = ctx.state, mi = col.sel.map, m = maps(col)[mi], hd = col.sel.head;
    const scores = st.mode === "s" && neuronOf(col, mi);
    let M;
    if (scores) {
      const Sc = scoresOf(col, mi, hd), ok = seesOf(col, mi);
      M = []; for (let i = 0; i < m.T; i++) { const r = []; for (let j = 0; j < m.S; j++) r.push(ok[i * m.S + j] ? Sc[i * m.S + j] : null); M.push(r); }
    } else M = rowsOf(weights(col, mi, hd), m);
    st.matrix.innerHTML = "";
    const t = heat(M, qTokens(col, m), kTokens(col, m), { signed: !!scores, decimals: scores ? 2 : 3, textMax: 32,
      onclick: (i, j) => { st.nq = i; st.nk = j; drawMatrix(ctx); drawNeuron(ctx); } });
    t.dataset.map = m.name; t.dataset.head = String(hd);
    st.matrix.append(t);
    const sel = st.nk === null || t.tagName !== "TABLE" ? null : t.querySelector('td[data-i="' + st.nq + '"][data-j="' + st.nk + '"]');
    if (sel) sel.classList.add("sel");
    st.cell.textContent = st.nk === null ? "click a cell to open it in the neuron view" :
      "query " + show(qTokens(col, m)[st.nq]) + " (" + st.nq + ") \u2192 key " + show(kTokens(col, m)[st.nk]) + " (" + st.nk + "): weight " +
      num(weights(col, mi, hd)[st.nq * m.S + st.nk], 4) + (neuronOf(col, mi) ? ", scaled score " + num(scoresOf(col, mi, hd)[st.nq * m.S + st.nk], 4) : "");
  }

  function drawNeuron(ctx) {
    const col = ctx.col, st = ctx.state, mi = col.sel.map, m = maps(col)[mi], n = m.neuron, box = st.neuron;
    box.innerHTML = "";
    if (!neuronOf(col, mi)) { box.append(h("div", { class: "help", text: n && n.why ? n.why : "no neuron view for this map" })); return; }
    if (col.sel.head < 0) { box.append(h("div", { class: "help", text: "pick one head (the neuron view splits one head's score)" })); return; }
    const hd = col.sel.head, V = qk(col, mi, hd), d = n.D, q = qTokens(col, m), k = kTokens(col, m);
    const W = weights(col, mi, hd), Sc = scoresOf(col, mi, hd), ok = seesOf(col, mi), i = st.nq;
    const qsel = h("select", {}, q.map((t, x) => h("option", { value: String(x), text: x + ": " + show(t) })));
    qsel.value = String(i);
    qsel.onchange = () => { st.nq = +qsel.value; st.nk = null; drawMatrix(ctx); drawNeuron(ctx); };
    box.append(h("div", { class: "controls" }, h("label", {}, "query token ", qsel),
      h("span", { class: "help", text: "q\u00b7k = \u03a3_d q_d k_d, times 1/\u221ad_k = " + num(n.scale, 4) + " (d_k = " + d + ")" + (n.rotary ? "; q and k after rotary positions" : "") })));
    const keys = h("table", { class: "num" }, h("tr", {}, ["key", "q\u00b7k", "\u00d7 1/\u221ad_k", "weight"].map((x) => h("th", { text: x }))));
    let best = 0; for (let j = 0; j < m.S; j++) if (ok[i * m.S + j] && W[i * m.S + j] > W[i * m.S + best]) best = j;
    if (st.nk === null) st.nk = best;
    for (let j = 0; j < m.S; j++) {
      const seen = ok[i * m.S + j], s = Sc[i * m.S + j];
      const tr = h("tr", { class: "click" + (seen ? "" : " masked") + (j === st.nk ? " sel" : ""), data: { key: j } },
        h("td", { text: j + ": " + show(k[j]) }), h("td", { text: num(s / n.scale, 4) }), h("td", { text: seen ? num(s, 4) : "masked" }),
        h("td", { text: num(W[i * m.S + j], 4) }));
      tr.onclick = () => { st.nk = j; drawMatrix(ctx); drawNeuron(ctx); };
      keys.append(tr);
    }
    const j = st.nk, detail = h("table", { class: "num" }, h("tr", {}, ["d", "q_d", "k_d", "q_d k_d"].map((x) => h("th", { text: x }))));
    let sum = 0;
    for (let x = 0; x < d; x++) {
      const a = V.q[i * d + x], b = V.k[j * d + x]; sum += a * b;
      detail.append(h("tr", {}, h("td", { text: String(x) }), h("td", { text: num(a, 4) }), h("td", { text: num(b, 4) }), h("td", { text: num(a * b, 4) })));
    }
    detail.append(h("tr", {}, h("th", { text: "sum" }), h("td"), h("td"), h("th", { text: num(sum, 4) })),
      h("tr", {}, h("th", { text: "\u00d7 1/\u221ad_k" }), h("td"), h("td"), h("th", { text: num(sum * n.scale, 4), data: { score: sum * n.scale } })));
    box.append(h("div", { class: "row" }, h("div", { style: "max-height:420px;overflow:auto" }, keys),
      h("div", { style: "max-height:420px;overflow:auto" }, h("div", { class: "help", text: "query " + show(q[i]) + " \u00b7 key " + show(k[j]) }), detail)));
    const why = col.data.explorer.why;  // the command that splits this score by writer
    if (why) {
      const sh = (x) => /^[A-Za-z0-9_.,/:=@%+-]+$/.test(x) ? x : "'" + x.replace(/'/g, "'\\''") + "'";
      const S = col.data.explorer.stacks, at = (stack, x) => (S[stack] ? S[stack].offset : 0) + x;
      box.append(h("div", { class: "help" }, "why this score, writer by writer: ",
        h("code", { class: "why-command", text: "attnlab why " + sh(why.run) + " " + sh(why.text) + " --head " + m.module +
          ".head" + hd + " --query " + at(m.qstack, i) + " --key " + at(m.kstack, j) })));
    }
  }

  function drawImage(ctx) {
    const col = ctx.col, st = ctx.state, D = col.data.explorer;
    st.imagebox.hidden = !D.image;
    if (!D.image) return;
    const mi = col.sel.map, m = D.maps[mi], W = weights(col, mi, col.sel.head), k = kTokens(col, m), q = qTokens(col, m);
    if (!st.img || st.imgSrc !== D.image.src) { st.img = new Image(); st.img.onload = () => drawImage(ctx); st.img.src = D.image.src; st.imgSrc = D.image.src; }
    const c = st.image, x = c.getContext("2d"), px = 224, g = D.image.grid, cell = px / g;
    c.width = px; c.height = px + 18;
    x.fillStyle = "#fff"; x.fillRect(0, 0, c.width, c.height); x.imageSmoothingEnabled = false;
    if (st.img.complete) x.drawImage(st.img, 0, 0, px, px);
    const i = st.hover && st.hover.side === "q" ? st.hover.i : 0;
    const at = (t) => { const r = /^r(\d+)c(\d+)$/.exec(t); return r ? [+r[1], +r[2]] : null; };
    let top = 1e-9; k.forEach((t, j) => { if (at(t)) top = Math.max(top, W[i * m.S + j]); });
    k.forEach((t, j) => {
      const p = at(t); if (!p) return;
      x.fillStyle = "rgba(255,80,0," + (0.75 * W[i * m.S + j] / top).toFixed(3) + ")";
      x.fillRect(p[1] * cell, p[0] * cell, cell, cell);
    });
    x.fillStyle = "#222"; x.font = "11px monospace";
    x.fillText("query " + show(q[i] || "") + (D.image.truth ? ", true class " + D.image.truth : ""), 2, px + 13);
  }

  // -- poke: ablate a head ------------------------------------------------------------------------
  attnlab.ablate = function (col, label) {
    col.params.ablate = { head: label, mode: col.params.ablateMode || "zero" };
    const p = col.panels.find((x) => x.def.name === "ablate");
    if (p) { p.sec.classList.remove("closed"); col.update(["ablate"]); }
  };
  panel({
    name: "ablate", title: "poke: ablate a head", help: "click a head in the grid: its output is zeroed (or replaced by its mean) and the prediction and loss change beside the intact ones (attnlab ablate --json)",
    views: (ctx) => (ctx.col.params.ablate ? ["ablate"] : []),
    params: (ctx) => (ctx.col.params.ablate ? { ablate: ctx.col.params.ablate.head, mode: ctx.col.params.ablate.mode } : {}),
    init(ctx) {
      const col = ctx.col, mode = h("select", {}, h("option", { value: "zero", text: "zero" }), h("option", { value: "mean", text: "mean" }));
      mode.onchange = () => { col.params.ablateMode = mode.value; if (col.params.ablate) { col.params.ablate.mode = mode.value; col.update(["ablate"]); } };
      ctx.state.out = h("div", { class: "help", text: col.run.residual ? "click a head in the attention grid to ablate it" : "" });
      const controls = h("div", { class: "controls" }, h("label", {}, "mode ", mode));
      if (!col.run.residual) controls.append(h("button", { type: "button", text: "ablate the context vector", onclick: () => attnlab.ablate(col, "context") }));
      ctx.body.append(controls, ctx.state.out);
    },
    render(ctx) {
      const a = ctx.col.data.ablate, out = ctx.state.out;
      if (!a) return;
      out.className = ""; out.innerHTML = "";
      out.append(h("div", { class: "controls", data: { ablated: a.ablated } },
        h("b", { text: a.ablated + " (" + a.mode + ")" }),
        h("span", { text: "loss intact " }), h("b", { class: "loss-clean", text: num(a.clean_loss) }),
        h("span", { text: "ablated " }), h("b", { class: "loss-ablated", text: num(a.ablated_loss) }),
        h("span", { text: "change " }), h("b", { class: "loss-change", text: (a.loss_change >= 0 ? "+" : "") + num(a.loss_change) })),
        h("div", { class: "side" },
          h("div", { class: "intact" }, h("h3", { text: "intact" }), bars(a.top_clean, "token", "prob")),
          h("div", { class: "ablated" }, h("h3", { text: "with " + a.ablated + " ablated" }), bars(a.top_ablated, "token", "prob"))));
    },
  });

  // -- the walkthrough of one forward pass --------------------------------------------------------
  panel({
    name: "walkthrough", title: "walkthrough", help: "one forward pass, one step at a time, with its real numbers: tokens, embeddings, Q, K, V, scores, scale, mask, softmax, weighted sum, heads, W_O, residual, norm, feed-forward, logits (attnlab trace --json, for the selected layer and head)",
    views: ["trace"],
    // only the step shown, its first 24 x 24 numbers (the server's trace_step, trace_window);
    // another step is fetched when it is picked
    params: (ctx) => ({ trace_step: ctx.state.i, trace_window: 24 }),
    init(ctx) {
      const st = ctx.state; st.i = 0;
      const go = (i) => { const n = ctx.col.data.trace ? ctx.col.data.trace.steps.length : 1; st.i = Math.max(0, Math.min(i, n - 1)); ctx.col.update(["trace"]); };
      st.prev = h("button", { type: "button", text: "\u25c0", onclick: () => go(st.i - 1) });
      st.next = h("button", { type: "button", text: "\u25b6", onclick: () => go(st.i + 1) });
      st.pick = h("select"); st.pick.onchange = () => go(+st.pick.value);
      st.where = h("span", { class: "status" }); st.out = h("div");
      ctx.body.append(h("div", { class: "controls steps" }, st.prev, st.pick, st.next, st.where), st.out);
    },
    render(ctx) {
      const t = ctx.col.data.trace, st = ctx.state;
      const steps = t.steps;
      st.i = Math.min(st.i, steps.length - 1);
      const k = t.step !== undefined ? t.step : st.i;  // the step the server sent whole
      st.pick.innerHTML = ""; steps.forEach((s, i) => st.pick.add(new Option((i + 1) + ". " + s.title, String(i))));
      st.pick.value = String(k);
      st.where.textContent = "step " + (k + 1) + " of " + steps.length + " \u2014 layer " + t.layer + ", head " + t.head;
      const s = steps[k], out = st.out;
      out.innerHTML = "";
      out.dataset.step = s.name;
      out.append(h("h3", { text: s.title + (s.shape ? "   (" + s.shape.join(" \u00d7 ") + ")" : "") }), h("div", { class: "help", text: s.meaning }));
      if (k === 0) out.append(h("div", { class: "output", text: t.tokens.map((x, i) => show(x) + "=" + t.ids[i]).join("  ") }));
      if (s.values) {
        const V = Array.isArray(s.values[0]) ? s.values : [s.values];
        const R = V.slice(0, 24).map((r) => r.slice(0, 24));
        out.append(heat(R, s.rows || (V.length === t.tokens.length ? t.tokens : null), s.cols || null, { signed: true, decimals: 3, textMax: 32 }));
        const full = s.values_shape ? (s.values_shape.length > 1 ? s.values_shape : [1, s.values_shape[0]]) : [V.length, V[0].length];
        if (full[0] > 24 || full[1] > 24) out.append(h("div", { class: "help", text: "showing 24 \u00d7 24 of " + full[0] + " \u00d7 " + full[1] }));
        if (s.row_sums) out.append(h("div", { class: "help", text: "each row sums to 1: " + s.row_sums.map((x) => num(x, 3)).join(" ") }));
      }
      const list = s.predictions || s.classes;
      if (list) out.append(bars(list, list[0].token !== undefined ? "token" : "label", "prob"));
    },
  });

  // -- similarity before and after each block -----------------------------------------------------
  panel({
    name: "similarity", title: "similarity", help: "cosine similarity (or the raw dot product) of every pair of token vectors before and after each block (attnlab similarity [--measure dot] --json)",
    views: ["similarity"],
    applies: (r) => r.residual,
    params: (ctx) => ({ similarity_layer: ctx.state.layer }),  // only the layer shown; another is fetched when picked
    init(ctx) { ctx.state.layer = 0; ctx.state.pick = h("select"); ctx.state.out = h("div");
      ctx.state.pick.onchange = () => { ctx.state.layer = +ctx.state.pick.value; ctx.col.update(["similarity"]); };
      ctx.state.measure = h("select", { class: "measure", onchange: () => ctx.def.render(ctx) }, h("option", { value: "cosine", text: "cosine" }), h("option", { value: "dot", text: "dot product" }));
      ctx.body.append(h("div", { class: "controls" }, h("label", {}, "layer ", ctx.state.pick), h("label", {}, "measure ", ctx.state.measure)), ctx.state.out); },
    render(ctx) {
      const L = ctx.col.data.similarity.layers, st = ctx.state;
      st.layer = Math.min(st.layer, L.length - 1);
      const k = ctx.col.data.similarity.layer !== undefined ? ctx.col.data.similarity.layer : st.layer;  // the layer sent whole
      st.pick.innerHTML = ""; L.forEach((x, i) => st.pick.add(new Option(x.label, String(i)))); st.pick.value = String(k);
      const x = L[k], dot = st.measure.value === "dot" && x.dot_before !== undefined;
      const [B, A, mb, ma] = dot ? [x.dot_before, x.dot_after, x.mean_dot_before, x.mean_dot_after] : [x.before, x.after, x.mean_before, x.mean_after];
      const o = dot ? { signed: true, decimals: 2, textMax: 32 } : { signed: true, top: 1, decimals: 2, textMax: 32 };  // a dot product has no bound: its own largest
      st.out.innerHTML = "";
      st.out.append(h("div", { class: "row" },
        h("div", { class: "before" }, h("h3", { text: "before " + x.label + " (mean off-diagonal " + num(mb, 3) + ")" }), heat(B, x.tokens, x.tokens, o)),
        h("div", { class: "after" }, h("h3", { text: "after " + x.label + " (mean off-diagonal " + num(ma, 3) + ")" }), heat(A, x.tokens, x.tokens, o))));
    },
  });

  // -- influence ---------------------------------------------------------------------------------
  panel({
    name: "influence", title: "influence", help: "how far its context moved each token, layer by layer, and the source tokens that moved it most (attnlab influence --json; one layer at a time)",
    views: ["influence"],
    applies: (r) => r.residual,
    init(ctx) {
      const st = ctx.state;
      st.layer = 0; st.pick = h("select"); st.note = h("div", { class: "help" }); st.out = h("div");
      st.pick.onchange = () => { st.layer = +st.pick.value; ctx.def.render(ctx); };  // drawn from the rows it has
      ctx.body.append(st.note, h("div", { class: "controls" }, h("label", {}, "layer ", st.pick)), st.out);
    },
    render(ctx) {
      const d = ctx.col.data.influence, st = ctx.state;
      const layers = [...new Set(d.rows.map((r) => r.layer))];
      st.layer = Math.max(0, Math.min(st.layer, layers.length - 1));
      st.note.textContent = d.definition.context;
      st.pick.innerHTML = ""; layers.forEach((l, i) => st.pick.add(new Option(String(l), String(i)))); st.pick.value = String(st.layer);
      const t = h("table", { class: "num" }, h("tr", {}, ["layer", "pos", "token", "context", "rel change", "cosine", "attn share", "ffn share", "sources"].map((x) => h("th", { text: x }))));
      d.rows.filter((r) => r.layer === layers[st.layer]).forEach((r) => t.append(h("tr", { data: { layer: r.layer, position: r.position } },
        h("td", { text: r.layer }), h("td", { text: String(r.position) }), h("td", { text: show(r.token) }),
        h("td", { class: "context", text: num(r.context) }), h("td", { text: num(r.rel_change) }), h("td", { text: num(r.cosine) }),
        h("td", { text: num(r.attn_share) }), h("td", { text: num(r.ffn_share) }),
        h("td", { style: "text-align:left", text: r.sources.map((s) => show(s.token) + "@" + s.position + " " + num(s.share, 2)).join(", ") }))));
      st.out.innerHTML = ""; st.out.append(t);
    },
  });

  // -- logit lens ----------------------------------------------------------------------------------
  panel({
    name: "lens", title: "logit lens", help: "the top token the readout finds in the residual stream at each layer, with its probability (attnlab lens --json)",
    views: ["lens"], open: false,
    applies: (r) => r.residual,
    render(ctx) {
      const d = ctx.col.data.lens, b = ctx.body;
      b.innerHTML = "";
      const t = h("table", { class: "heat" }, h("tr", {}, h("th"), d.tokens.map((x) => h("th", { text: show(x).slice(0, 8) }))));
      d.points.forEach((p, i) => t.append(h("tr", {}, h("th", { text: p }), d.top[i].map((tok, j) => h("td", {
        class: "cell", title: "p = " + num(d.top_prob[i][j]) + ", KL to the output " + num(d.kl[i][j]), style: "background:" + colour(d.top_prob[i][j]),
        data: { p: d.top_prob[i][j] }, text: show(tok) })))));
      b.append(t);
      if (d.notes && d.notes.length) b.append(h("div", { class: "help", text: d.notes.join(" ") }));
    },
  });

  // -- direct logit attribution ---------------------------------------------------------------------
  panel({
    name: "dla", title: "direct logit attribution", help: "the target's logit split into what each part wrote to the residual stream (attnlab attribute --method dla --json; the target: the top prediction unless given)",
    views: ["dla"], open: false,
    applies: (r) => r.residual,
    params: (ctx) => (ctx.state.target && ctx.state.target.value ? { target: ctx.state.target.value } : {}),
    init(ctx) {
      ctx.state.target = h("input", { type: "text", placeholder: "top prediction", size: 10 });
      ctx.state.target.onchange = () => ctx.col.update(["dla"]);
      ctx.state.out = h("div");
      ctx.body.append(h("div", { class: "controls" }, h("label", {}, "target ", ctx.state.target)), ctx.state.out);
    },
    render(ctx) {
      const d = ctx.col.data.dla, out = ctx.state.out;
      out.innerHTML = "";
      out.append(h("div", { class: "help", text: "logit of " + show(d.target) + " at position " + d.position + ": " + num(d.logit) + " = sum of the parts " + num(d.sum) + (d.frozen && d.frozen.length ? "; frozen: " + d.frozen.join(", ") : "") }),
        bars(d.components, "name", "value"));
    },
  });

  // -- patching ---------------------------------------------------------------------------------
  panel({
    name: "patch", title: "patching", help: "run the corrupt input with one activation of the clean input (the text above) put back, by layer \u00d7 position or layer \u00d7 head: how much of the clean answer it recovers (attnlab patch --json)",
    views: (ctx) => (ctx.state.on ? ["patch"] : []), open: false,
    applies: (r) => r.residual,
    params: (ctx) => ({ corrupt: ctx.state.corrupt.value, target: ctx.state.target.value || null, by: ctx.state.by.value }),
    init(ctx) {
      const st = ctx.state;
      st.corrupt = h("input", { type: "text", size: 30, placeholder: "corrupt input (same length)" });
      st.target = h("input", { type: "text", size: 8, placeholder: "top prediction" });
      st.by = h("select", {}, h("option", { value: "position", text: "layer \u00d7 position" }), h("option", { value: "head", text: "layer \u00d7 head" }));
      st.out = h("div");
      const go = () => { st.on = true; ctx.col.update(["patch"]); };
      ctx.body.append(h("div", { class: "controls" }, h("label", {}, "corrupt ", st.corrupt), h("label", {}, "target ", st.target),
        h("label", {}, "by ", st.by), h("button", { type: "button", text: "patch", onclick: go })), st.out);
      st.by.onchange = () => { if (st.on) go(); };
    },
    render(ctx) {
      const d = ctx.col.data.patch, out = ctx.state.out;
      out.innerHTML = "";
      const key = d.by === "head" ? "head" : "position";
      const layers = [...new Set(d.results.map((r) => r.layer))], cols = [...new Set(d.results.map((r) => r[key]))];
      const M = layers.map((l) => cols.map((c) => { const r = d.results.find((x) => x.layer === l && x[key] === c); return r ? r.recovered : null; }));
      const toks = d.tokens && Object.values(d.tokens)[0];
      out.append(h("div", { class: "help", text: d.metric + ": clean " + num(d.clean_metric) + ", corrupt " + num(d.corrupt_metric) + (d.warning ? " \u2014 " + d.warning : "") }),
        heat(M, layers.map((l) => "layer " + l), key === "position" && toks ? cols.map((c) => toks[c]) : cols.map((c) => "head " + c), { signed: true, top: 1, decimals: 2, textMax: 32 }));
    },
  });

  // -- generation, token by token ------------------------------------------------------------------
  panel({
    name: "generate", title: "generation", help: "the continuation, token by token, with each new token's attention over the tokens before it for the selected head (attnlab generate --json, at the seed given)",
    views: (ctx) => (ctx.state.on ? ["generate"] : []), open: false,
    applies: (r) => r.decodes && r.reads === "text",
    params: (ctx) => ({ max_new_tokens: +ctx.state.n.value, temperature: +ctx.state.temp.value, seed: +ctx.state.seed.value }),
    init(ctx) {
      const st = ctx.state;
      st.n = h("input", { type: "number", min: 1, max: 256, value: 20, style: "width:4em" });
      st.temp = h("input", { type: "number", min: 0, max: 100, step: 0.1, value: 0.8, style: "width:4em" });
      st.seed = h("input", { type: "number", min: 0, value: 0, style: "width:6em" });
      st.out = h("div"); st.att = h("div");
      ctx.body.append(h("div", { class: "controls" }, h("label", {}, "new tokens ", st.n), h("label", {}, "temperature ", st.temp), h("label", {}, "seed ", st.seed),
        h("button", { type: "button", text: "generate", onclick: () => { st.on = true; ctx.col.update(["generate"]); } })), st.out, st.att);
    },
    render(ctx) {
      const d = ctx.col.data.generate, st = ctx.state, col = ctx.col;
      clearInterval(st.timer);
      st.out.innerHTML = ""; st.att.innerHTML = "";
      st.out.append(h("div", { class: "output sample", text: d.samples[0].prompt + d.samples[0].text }));
      if (!d.steps.length) return;
      const line = h("div"), off = d.offset || 0, start = d.steps[0].position - off;
      d.tokens.slice(0, start).forEach((t) => line.append(h("span", { class: "tok", text: show(t) })));
      st.out.append(h("h3", { text: "token by token (click a new token: its attention)" }), line);
      const showStep = (s) => {
        line.querySelectorAll(".tok.on").forEach((x) => x.classList.remove("on"));
        const m = maps(col)[col.sel.map], name = m ? m.name : Object.keys(s.attention)[0];
        const rows = s.attention[name] || Object.values(s.attention)[0], hd = Math.max(0, Math.min(col.sel.head, rows.length - 1));
        st.att.innerHTML = "";
        st.att.append(h("div", { class: "help", text: "new token " + show(s.token) + " at " + s.position + ": " + name + " head " + hd }),
          bars(rows[hd].map((w, j) => ({ token: (j + off) + ":" + show(d.tokens[j]), w: w })), "token", "w"));
      };
      let n = 0;
      st.timer = setInterval(() => {  // one token at a time, each with its attention
        if (n >= d.steps.length) { clearInterval(st.timer); return; }
        const s = d.steps[n++], el = h("span", { class: "tok new on", text: show(s.token), data: { position: s.position } });
        el.onclick = () => { showStep(s); el.classList.add("on"); };
        line.append(el); showStep(s); el.classList.add("on");
      }, 60);
    },
  });

  // -- what if: one piece of the selected head's attention changed at a time ----------------------
  panel({
    name: "what_if", title: "what if", help: "the selected head's attention as the model computes it, and with one piece changed at a time: no 1/\u221ad_k scale, no causal mask, a temperature T and 1/T, pads without a padding mask (attnlab what-if --json)",
    views: ["what_if"], open: false,
    applies: (r) => r.residual,
    params: (ctx) => ({ what_if_temperature: +ctx.state.temp.value, what_if_pad: +ctx.state.pad.value }),
    init(ctx) {
      const st = ctx.state, again = () => ctx.col.update(["what_if"]);
      st.temp = h("input", { type: "number", min: 0.01, step: 0.1, value: 2, style: "width:4em", onchange: again });
      st.pad = h("input", { type: "number", min: 0, max: 256, value: 2, style: "width:4em", onchange: again });
      st.pick = h("select"); st.pick.onchange = () => ctx.def.render(ctx); st.out = h("div");
      ctx.body.append(h("div", { class: "controls" }, h("label", {}, "change ", st.pick), h("label", {}, "temperature ", st.temp), h("label", {}, "pads ", st.pad)), st.out);
    },
    render(ctx) {
      const w = ctx.col.data.what_if, st = ctx.state, was = st.pick.value;
      st.pick.innerHTML = ""; w.changes.forEach((c) => st.pick.add(new Option(c.title, c.name)));
      if (w.changes.some((c) => c.name === was)) st.pick.value = was;
      const c = w.changes.find((x) => x.name === st.pick.value) || w.changes[0];
      st.out.innerHTML = "";
      st.out.append(h("div", { class: "help", text: w.heading + " \u2014 " + w.baseline }),
        h("div", { class: "help finding", text: c.finding }),
        h("div", { class: "row" },
          h("div", { class: "before" }, h("h3", { text: "as it runs" }), heat(w.before, w.rows, w.cols, { top: 1, decimals: 2, textMax: 32 })),
          h("div", { class: "after", data: { change: c.name } }, h("h3", { text: c.title }), heat(c.after, w.rows, c.cols || w.cols, { top: 1, decimals: 2, textMax: 32 }))));
    },
  });

  // -- each decoder step's attention over the source ------------------------------------------------
  panel({
    name: "align", title: "source attention", help: "the output decoded and, one row per decoder step (the token fed \u2192 the token output), its weights over the source: an LSTM's alignment, a Transformer's cross-attention (mean over heads and layers); put an LSTM beside a Transformer for the notes' \u201clet's go\u201d \u2192 \u201cvamos\u201d (attnlab align --json)",
    views: ["align"], open: false,
    applies: (r) => r.reads === "source",
    params: (ctx) => ({ align_words: ctx.state.words.checked }),
    init(ctx) {
      const st = ctx.state;
      st.words = h("input", { type: "checkbox", onchange: () => ctx.col.update(["align"]) }); st.out = h("div");
      ctx.body.append(h("div", { class: "controls" }, h("label", {}, st.words, " words (each word's tokens added up)")), st.out);
    },
    render(ctx) {
      const m = ctx.col.data.align.models[0], out = ctx.state.out;
      out.innerHTML = "";
      out.append(h("div", { class: "help", text: m.model + ": " + m.label }), h("div", { class: "output", text: m.output }),
        heat(m.steps.map((s) => s.weights), m.steps.map((s) => s.fed + " \u2192 " + s.next), m.source, { top: 1, decimals: 2, textMax: 32 }));
    },
  });

  // -- attention by hand ---------------------------------------------------------------------------
  panel({
    name: "walk", title: "by hand", help: "the words typed as the tokens, with your own X, W_Q, W_K, W_V (rows typed, ';' between them) or random ones of the sizes given, walked through the steps of attention; the switches show what each piece is for (attnlab walk --tokens TEXT --json)",
    views: ["walk"], open: false,
    applies: (r) => r.reads !== "image",
    params(ctx) {
      const st = ctx.state, p = { hand_m: +st.m.value, hand_d_k: +st.dk.value, hand_d_v: +st.dv.value, hand_seed: +st.seed.value,
        hand_scale: st.scale.checked, hand_causal: st.causal.checked, hand_temperature: +st.temp.value, hand_pad: +st.pad.value, hand_padding_mask: st.pmask.checked };
      for (const k of ["x", "wq", "wk", "wv"]) p["hand_" + k] = st[k].value;
      return p;
    },
    init(ctx) {
      const st = ctx.state, again = () => ctx.col.update(["walk"]), num_ = (v, w) => h("input", { type: "number", min: 0, value: v, style: "width:" + (w || 4) + "em", onchange: again });
      st.i = 0; st.m = num_(8); st.dk = num_(3); st.dv = num_(3); st.seed = num_(0, 6); st.pad = num_(0);
      st.temp = h("input", { type: "number", min: 0.01, step: 0.1, value: 1, style: "width:4em", onchange: again });
      const box = (v) => h("input", { type: "checkbox", checked: v, onchange: again });
      st.scale = box(true); st.causal = box(true); st.pmask = box(true);
      for (const k of ["x", "wq", "wk", "wv"]) st[k] = h("textarea", { rows: 2, cols: 28, class: "hand-" + k, placeholder: "random", onchange: again });
      st.pick = h("select"); st.pick.onchange = () => { st.i = +st.pick.value; ctx.def.render(ctx); };
      st.out = h("div");
      ctx.body.append(
        h("div", { class: "controls" }, h("label", {}, "M ", st.m), h("label", {}, "d_k ", st.dk), h("label", {}, "d_v ", st.dv), h("label", {}, "seed ", st.seed)),
        h("div", { class: "controls" }, h("label", {}, "X ", st.x), h("label", {}, "W_Q ", st.wq), h("label", {}, "W_K ", st.wk), h("label", {}, "W_V ", st.wv)),
        h("div", { class: "controls" }, h("label", {}, st.scale, " 1/\u221ad_k scale"), h("label", {}, st.causal, " causal mask"), h("label", {}, "temperature ", st.temp),
          h("label", {}, "pad ", st.pad), h("label", {}, st.pmask, " padding mask")),
        h("div", { class: "controls steps" }, st.pick), st.out);
    },
    render(ctx) {
      const w = ctx.col.data.walk, st = ctx.state, steps = w.steps;
      st.i = Math.min(st.i, steps.length - 1);
      st.pick.innerHTML = ""; steps.forEach((s, i) => st.pick.add(new Option((i + 1) + ". " + s.title, String(i))));
      st.pick.value = String(st.i);
      const s = steps[st.i], out = st.out;
      out.innerHTML = ""; out.dataset.step = s.name;
      out.append(h("h3", { text: s.title + (s.shape ? "   (" + s.shape.join(" \u00d7 ") + ")" : "") }), h("div", { class: "help", text: s.meaning }));
      if (st.i === 0) out.append(h("div", { class: "output", text: w.tokens.map(show).join("  ") + "   (" + w.inputs.source + ")" }));
      if (s.values) {
        const V = Array.isArray(s.values[0]) ? s.values : [s.values];
        out.append(heat(V, s.rows || null, s.cols || null, { signed: true, decimals: 3, textMax: 32 }));
      }
    },
  });

  // -- watch it learn ------------------------------------------------------------------------------
  panel({
    name: "learn", title: "watch it learn", help: "what attnlab train has written to this run so far: the loss curve and, with snapshots, every head's scores (attnlab timeline --json); read without the writer's lock, every 2 s while ticked",
    views: [], open: false,
    init(ctx) {
      const st = ctx.state, col = ctx.col;
      st.watch = h("input", { type: "checkbox" }); st.out = h("div"); st.score = h("select", {}, ["induction", "previous-token", "duplicate-token", "first-token"].map((x) => h("option", { value: x, text: x })));
      const tick = async () => {
        try {
          const d = await api("/api/learn?run=" + encodeURIComponent(col.name));
          const stamp = JSON.stringify([d.loss.length, d.timeline ? d.timeline.steps.length : 0]);
          col.data.learn = d; drawLearn(ctx);
          if (st.stamp && stamp !== st.stamp) col.update();  // a checkpoint landed: every open panel again
          st.stamp = stamp;
        } catch (e) { st.out.textContent = e.message; }
      };
      st.watch.onchange = () => { clearInterval(st.timer); if (st.watch.checked) { tick(); st.timer = setInterval(tick, 2000); } };
      st.score.onchange = () => drawLearn(ctx);
      ctx.body.append(h("div", { class: "controls" }, h("label", {}, st.watch, " watch"), h("label", {}, "score ", st.score),
        h("button", { type: "button", text: "read now", onclick: tick })), st.out);
    },
    render() {},
  });
  function curve(points, w, hgt, label) {  // an SVG polyline of (x, y) points
    const ns = "http://www.w3.org/2000/svg", svg = document.createElementNS(ns, "svg");
    svg.setAttribute("width", w); svg.setAttribute("height", hgt);
    if (!points.length) return svg;
    const xs = points.map((p) => p[0]), ys = points.map((p) => p[1]);
    const x0 = Math.min(...xs), x1 = Math.max(...xs, x0 + 1), y0 = Math.min(...ys), y1 = Math.max(...ys, y0 + 1e-9);
    const line = document.createElementNS(ns, "polyline");
    line.setAttribute("points", points.map((p) => (40 + (w - 50) * (p[0] - x0) / (x1 - x0)).toFixed(1) + "," + (hgt - 16 - (hgt - 26) * (p[1] - y0) / (y1 - y0)).toFixed(1)).join(" "));
    line.setAttribute("fill", "none"); line.setAttribute("stroke", "#1f77b4"); line.setAttribute("stroke-width", "1.5");
    svg.append(line);
    const txt = (x, y, s) => { const t = document.createElementNS(ns, "text"); t.setAttribute("x", x); t.setAttribute("y", y); t.textContent = s; svg.append(t); };
    txt(2, 12, num(y1, 3)); txt(2, hgt - 16, num(y0, 3)); txt(40, hgt - 2, "step " + x0); txt(w - 80, hgt - 2, "step " + x1);
    if (label) txt(50, 12, label);
    return svg;
  }
  function drawLearn(ctx) {
    const d = ctx.col.data.learn, out = ctx.state.out, score = ctx.state.score.value;
    out.innerHTML = "";
    const last = d.loss.length ? d.loss[d.loss.length - 1] : null;
    out.append(h("div", { class: "help learn-last", data: { step: last ? last.step : "", loss: last ? last.train_loss : "" },
      text: last ? "step " + last.step + ": train loss " + num(last.train_loss) + " (" + d.loss.length + " rows)" : "no training rows yet" }),
      curve(d.loss.map((r) => [r.step, r.train_loss]), 420, 140, "train loss"));
    if (!d.timeline) { out.append(h("div", { class: "help", text: d.note })); return; }
    const tl = d.timeline;
    out.append(h("h3", { text: score + " score of every head over " + tl.steps.length + " snapshots" }));
    const t = h("table", { class: "num" }, h("tr", {}, ["head", "last", "rose fastest at"].map((x) => h("th", { text: x })), h("th", { text: "curve" })));
    tl.heads.forEach((hd) => {
      const ys = hd.scores[score] || [], f = hd.fastest_rise[score];
      const pts = tl.steps.map((s, i) => [s, ys[i]]).filter((p) => p[1] !== null && p[1] !== undefined);
      t.append(h("tr", { data: { head: hd.name } }, h("td", { text: hd.name }), h("td", { text: ys.length ? num(ys[ys.length - 1], 3) : "-" }),
        h("td", { text: f ? String(f.step) : "-" }), h("td", {}, curve(pts, 160, 36))));
    });
    out.append(t);
    drawMaps(ctx, d.maps, out);
  }
  // Each head's attention at each snapshot that kept one (attnlab explore RUN --steps's data:
  // one byte per weight, round(255 w), base64): the head picked, at the snapshot on the slider
  // (the newest one, as they land, until the slider is moved back).
  function drawMaps(ctx, maps, out) {
    const st = ctx.state, probe = maps && (maps.probes.repeat || maps.probes.sample);
    if (!probe) return;
    const heads = probe.heads.filter((hd) => probe.frames.some((f) => f.maps[hd.map]));
    if (!heads.length) return;
    if (!heads.some((hd) => hd.name === st.mapHead)) st.mapHead = heads[heads.length - 1].name;
    const n = probe.frames.length, k = st.frame === undefined || st.frame === null ? n - 1 : Math.min(st.frame, n - 1);
    const pick = h("select", {}, heads.map((hd) => h("option", { value: hd.name, text: "head " + hd.name })));
    pick.value = st.mapHead;
    pick.onchange = () => { st.mapHead = pick.value; drawLearn(ctx); };
    const slider = h("input", { type: "range", min: "0", max: String(n - 1), value: String(k), class: "snapshot" });
    slider.oninput = () => { st.frame = +slider.value >= n - 1 ? null : +slider.value; drawLearn(ctx); };  // the last: follow new ones
    const hd = heads.find((x) => x.name === st.mapHead), frame = probe.frames[k];
    const rows = (frame.maps[hd.map] || [])[hd.head];
    out.append(h("h3", { text: "attention map at each snapshot" }),
      h("div", { class: "controls" }, h("label", {}, "head ", pick), h("label", {}, "snapshot ", slider),
        h("span", { class: "status learn-map", data: { step: frame.step, head: hd.name, frames: n }, text: "step " + frame.step + " (" + (k + 1) + " of " + n + " snapshots with maps)" })));
    if (!rows) { out.append(h("div", { class: "help", text: "this snapshot kept no map of " + hd.map })); return; }
    const bytes = atob(rows), T = probe.T, M = [];
    for (let i = 0; i < T; i++) { const r = []; for (let j = 0; j < T; j++) r.push(bytes.charCodeAt(i * T + j) / 255); M.push(r); }
    const last = M[T - 1], tok = probe.tokens || [];
    out.append(h("div", { class: "learn-heat" }, heat(M, tok, tok, { top: 1, decimals: 2, textMax: 24 })),
      h("div", { class: "help" }, "the last query (" + show(tok[T - 1] || String(T - 1)) + ") over the keys: ",
        h("span", { class: "learn-row", text: last.map((v) => num(v, 2)).join(" ") })));
  }
})();
