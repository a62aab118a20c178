/*
 * article.js: the figures the articles describe in prose, beyond the paper's attention figures: what
 * the QK^T table costs, multi-head attention at the paper's size beside Table 3, the encoder and the
 * decoder, training at once against generating one token at a time, and GPT's practice problems.
 * The last two draw a model's trace (qkv/interpret/traces.py): from the server's /api/trace when
 * `qkv explore --run` loaded a model of that kind, else the one embedded in traces.js.
 * Exposed as globalThis.QKVArticleFigures.
 */
(function () {
  "use strict";

  var F = globalThis.QKVFigures;
  var C = globalThis.QKVConstants;
  var D = globalThis.QKVDraw;
  var L = globalThis.QKVLang;
  var T = L.T, plain = L.plain;
  var $ = D.$, h = D.h, s = D.s, setAttrs = D.setAttrs, fmt = D.fmt, pct = D.pct;

  // An element whose content is catalog HTML (inline <i>, <b>, <sub> only, from catalog.js).
  function hx(tag, attrs, key, slots) {
    var node = h(tag, attrs);
    node.innerHTML = T(key, slots);
    return node;
  }

  function grouped(n) { return Math.round(n).toLocaleString("en-US"); }

  // Bytes in decimal units, as people read disk and memory sizes.
  function bytes(n) {
    var units = ["B", "KB", "MB", "GB", "TB"], i = 0;
    while (n >= 1000 && i < units.length - 1) { n /= 1000; i++; }
    return (i === 0 ? String(n) : n.toPrecision(3)) + " " + units[i];
  }

  // ------------------------------------------------------------------ the table's cost
  function initCost() {
    var slider = $("cost-n");
    slider.setAttribute("max", String(C.COST_MAX_TOKENS));
    slider.value = String(C.COST_DEFAULT_TOKENS);
    var W = 420, H = 240, left = 62, right = 14, top = 14, bottom = 40;
    var max = C.COST_MAX_TOKENS;
    var svg = s("svg", { "class": "costchart", viewBox: "0 0 " + W + " " + H, role: "img", "aria-label": plain("cost.chart_aria") });
    $("cost-chart").appendChild(svg);
    function x(n) { return left + (W - left - right) * n / max; }
    function y(v) { return H - bottom - (H - top - bottom) * v / (max * max); }
    for (var t = 0; t <= max; t += 250) {
      s("line", { "class": "gridline", x1: x(t), x2: x(t), y1: y(0), y2: y(max * max) }, svg);
      s("text", { "class": "tick", x: x(t), y: H - bottom + 14, "text-anchor": "middle", text: String(t) }, svg);
    }
    [0, 0.25, 0.5, 0.75, 1].forEach(function (f) {
      var v = f * max * max;
      s("line", { "class": "gridline", x1: x(0), x2: x(max), y1: y(v), y2: y(v) }, svg);
      s("text", { "class": "tick", x: left - 6, y: y(v) + 4, "text-anchor": "end", text: grouped(v) }, svg);
    });
    var d = [];
    for (var n = 0; n <= max; n += 10) d.push((n ? "L" : "M") + x(n).toFixed(1) + "," + y(n * n).toFixed(1));
    s("path", { "class": "curve", d: d.join(" ") }, svg);
    s("text", { "class": "axislabel", x: (left + W - right) / 2, y: H - 6, "text-anchor": "middle", text: plain("cost.x_axis") }, svg);
    s("text", { "class": "axislabel", x: 12, y: (top + H - bottom) / 2, "text-anchor": "middle",
      transform: "rotate(-90 12 " + (top + H - bottom) / 2 + ")", text: plain("cost.y_axis") }, svg);
    var guideV = s("line", { "class": "guide" }, svg), guideH = s("line", { "class": "guide" }, svg);
    var dot = s("circle", { "class": "marker", r: 6 }, svg);

    function update() {
      var k = Number(slider.value);
      var one = F.tableCost(k), paper = C.PAPER;
      var tables = paper.n_heads * paper.n_layers;
      var all = F.tableCost(k, tables);
      $("cost-n-val").textContent = String(k);
      setAttrs(dot, { cx: x(k), cy: y(one.scores) });
      setAttrs(guideV, { x1: x(k), x2: x(k), y1: y(0), y2: y(one.scores) });
      setAttrs(guideH, { x1: x(0), x2: x(k), y1: y(one.scores), y2: y(one.scores) });
      var oneBox = $("cost-one");
      oneBox.innerHTML = T("cost.one_head", { n: k, scores: grouped(one.scores), mem: bytes(one.bytes) });
      oneBox.setAttribute("data-scores", String(one.scores));
      oneBox.setAttribute("data-bytes", String(one.bytes));
      $("cost-paper").innerHTML = T("cost.paper", { heads: paper.n_heads, layers: paper.n_layers, tables: tables,
        scores: grouped(all.scores), mem: bytes(all.bytes) });
    }
    slider.addEventListener("input", update);
    update();
    return { set: function (k) { slider.value = String(k); update(); } };
  }

  // ------------------------------------------------------------------ multi-head at the paper's size
  var HEAD_CHOICES = [1, 2, 4, 8, 16, 32];

  function initMultihead() {
    var slider = $("multihead-h");
    slider.setAttribute("max", String(HEAD_CHOICES.length - 1));
    slider.value = String(HEAD_CHOICES.indexOf(C.PAPER.n_heads));
    var blocks = $("multihead-blocks");
    var d = C.PAPER.d_model;

    function update() {
      var heads = HEAD_CHOICES[Number(slider.value)], dk = d / heads;
      $("multihead-h-val").textContent = String(heads);
      blocks.textContent = "";
      var row = h("div", { "class": "mh-row" });
      for (var k = 0; k < heads; k++) {
        var b = h("div", { "class": "mh-head", "data-testid": "multihead-head", title: T("fig6.head_n", { n: k + 1 }) + " · " + dk },
          heads <= 16 ? [String(dk)] : []);
        b.style.background = D.tint(D.COLORS[k % D.COLORS.length], 0.35 + 0.4 * ((k % 2)));
        row.appendChild(b);
      }
      blocks.appendChild(row);
      blocks.appendChild(h("div", { "class": "mh-concat" }, ["↓ " + plain("multihead.concat") + " · " + d + " → W", h("sup", { text: "O" }), " (" + d + " × " + d + ")"]));
      var split = $("multihead-split");
      split.innerHTML = T("multihead.split", { h: heads, dk: dk, d: d, params: grouped(4 * d * d) });
      split.setAttribute("data-dk", String(dk));
    }
    slider.addEventListener("input", update);
    update();
    drawTable3();
  }

  function drawTable3() {
    var data = globalThis.QKVTable3;
    var box = $("multihead-table");
    if (!data) return;
    function signed(x, digits) { return (x > 0 ? "+" : "") + fmt(x, digits); }
    var table = h("table", { "class": "t3", "data-testid": "table3" });
    table.appendChild(h("tr", {}, ["multihead.col_change", "multihead.col_paper", "multihead.col_paper_delta",
      "multihead.col_ours", "multihead.col_ours_delta"].map(function (k) { return h("th", { text: T(k) }); })));
    data.rows.forEach(function (r) {
      var name;
      if (r.row === "base") name = T("multihead.row_base");
      else if (r.row === "A") name = T("multihead.row_heads", { ours: r.label.split("=")[1], paper: r.paper_row.split("=")[1] });
      else name = T("multihead.row_learned");
      table.appendChild(h("tr", { "data-row": r.row + " " + r.label }, [
        h("td", { text: name }),
        h("td", { "class": "num", text: r.paper_bleu === null ? "" : fmt(r.paper_bleu, 1) }),
        h("td", { "class": "num", text: r.row === "base" ? "" : signed(r.paper_delta, 1) }),
        h("td", { "class": "num", text: fmt(r.bleu, 1) + " ± " + fmt(r.bleu_sd, 1) }),
        h("td", { "class": "num", text: r.bleu_delta === null ? "" : signed(r.bleu_delta, 1) + " ± " + fmt(r.bleu_delta_sd, 1) })
      ]));
    });
    box.appendChild(table);
  }

  // ------------------------------------------------------------------ the encoder and the decoder
  // Each box: its catalog key, the figure it opens (by section id and its displayed number).
  var STACK_BOXES = {
    embed: { open: ["fig5", 7] },
    self_attn: { open: ["fig1", 1] },
    masked_attn: { open: ["teacher", 9] },
    cross_attn: { open: ["teacher", 9] },
    add_norm: { open: null },
    ffn: { open: null },
    output: { open: ["teacher", 9] }
  };

  function paperSizes() {
    var p = C.PAPER;
    return { d_model: p.d_model, n_heads: p.n_heads, d_k: p.d_k, d_ff: p.d_ff, n_layers: p.n_layers, n_decoder_layers: p.n_layers };
  }

  function initStack(runSizes, runLabelKey) {
    var choices = [["paper", T("stack.sizes_paper"), paperSizes()]];
    if (runSizes && runSizes.arch === "transformer") choices.push(["run", T(runLabelKey), runSizes]);
    var which = $("stack-which");
    // A model loaded with --run opens on its own sizes; otherwise the paper's.
    var current = runLabelKey === "stack.sizes_run" ? choices[choices.length - 1] : choices[0];
    var picked = null;
    var buttons = choices.map(function (c) {
      var b = h("button", { type: "button", "data-sizes": c[0], text: c[1] });
      b.addEventListener("click", function () { current = c; draw(); });
      which.appendChild(b);
      return b;
    });

    function slots(z) {
      return { d: z.d_model, h: z.n_heads, dk: z.d_k, ff: z.d_ff, ne: z.n_layers, nd: z.n_decoder_layers };
    }

    function box(key, z) {
      var label = key === "ffn" ? T("stack.ffn", slots(z)) : T("stack." + key);
      var b = h("button", { type: "button", "class": "sbox sbox-" + key, "data-box": key, "data-testid": "stack-box" }, [label]);
      b.addEventListener("click", function () { picked = key; detail(); });
      return b;
    }

    // One stack: its repeated layer in a dashed box (× N), the embedding and the input below it,
    // drawn bottom to top as the paper's Figure 1.
    function column(title, keys, inputKey, z) {
      var layer = h("div", { "class": "slayer" });
      keys.forEach(function (k) { layer.appendChild(box(k, z)); });
      var repeated = h("div", { "class": "scol" }, [h("div", { "class": "stitle", text: title }), layer]);
      return h("div", { "class": "sstack" }, [repeated, box("embed", z), h("div", { "class": "sin", text: T(inputKey) })]);
    }

    function draw() {
      var z = current[2];
      buttons.forEach(function (b, i) { b.setAttribute("aria-pressed", String(choices[i] === current)); });
      var sizes = $("stack-sizes");
      sizes.innerHTML = T("stack.sizes", slots(z));
      sizes.setAttribute("data-d-model", String(z.d_model));
      var diagram = $("stack-diagram");
      diagram.textContent = "";
      diagram.setAttribute("role", "group");
      diagram.setAttribute("aria-label", plain("stack.diagram_aria"));
      var enc = column(T("stack.encoder", { n: z.n_layers }), ["add_norm", "ffn", "add_norm", "self_attn"], "stack.source", z);
      var dec = column(T("stack.decoder", { n: z.n_decoder_layers }),
        ["add_norm", "ffn", "add_norm", "cross_attn", "add_norm", "masked_attn"], "stack.target", z);
      diagram.appendChild(h("div", { "class": "sdecoder-out" }, [h("div", { "class": "sout" }, [box("output", z)])]));
      diagram.appendChild(h("div", { "class": "scols" }, [enc, h("div", { "class": "sarrow", text: "→ k, v →" }), dec]));
      detail();
    }

    function detail() {
      var out = $("stack-detail");
      out.textContent = "";
      if (!picked) { out.appendChild(h("p", { "class": "label", text: T("stack.pick") })); return; }
      Array.prototype.forEach.call(document.querySelectorAll("#stack-diagram .sbox"), function (b) {
        b.classList.toggle("sel", b.getAttribute("data-box") === picked);
      });
      var z = current[2];
      var label = picked === "ffn" ? T("stack.ffn", slots(z)) : T("stack." + picked);
      out.appendChild(h("h3", { text: label }));
      out.appendChild(hx("p", { "data-testid": "stack-detail-text" }, "stack.d_" + picked, slots(z)));
      var open = STACK_BOXES[picked].open;
      if (open) out.appendChild(h("a", { href: "#" + open[0], "class": "open", text: T("stack.open", { n: open[1] }) }));
    }

    draw();
    return { pick: function (key) { picked = key; detail(); } };
  }

  // ------------------------------------------------------------------ forms for a live model
  // One text box and a button that ask answers.js for a trace, for the two trace figures.
  function traceForm(body, source, keys, initial, render) {
    var status = source.status;
    var input = h("input", { type: "text", "class": "trace-text", maxlength: String(status.max_text_chars || 500), "aria-label": plain(keys.aria) });
    input.value = initial;
    var button = h("button", { type: "submit", "class": "primary", text: T(keys.run) });
    var form = h("form", { "class": "controls" }, [input, button]);
    var out = h("div", { "aria-live": "polite", "data-testid": keys.testid });
    body.appendChild(h("p", { "class": "label" }, [T(keys.model, { name: status.model_name || "" })]));
    body.appendChild(form);
    body.appendChild(out);
    var asked = 0;
    function run() {
      var mine = ++asked;
      button.disabled = true;
      button.textContent = T(keys.busy);
      source.trace(input.value).then(function (tr) {
        if (mine !== asked) return;
        out.textContent = "";
        out.qkvAnswer = tr;
        (tr.notes || []).forEach(function (n) { out.appendChild(h("p", { "class": "note", role: "status", text: n })); });
        render(out, tr);
      }).catch(function (err) {
        if (mine !== asked) return;
        out.textContent = "";
        out.appendChild(h("p", { "class": "error", role: "alert", text: err.qkvKey ? err.message : T("fig6.failed", { error: err.message }) }));
      }).then(function () {
        if (mine !== asked) return;
        button.disabled = false;
        button.textContent = T(keys.run);
        out.setAttribute("data-done", String(mine));
      });
    }
    form.addEventListener("submit", function (e) { e.preventDefault(); run(); });
    run();
  }

  // ------------------------------------------------------------------ training at once, generating one by one
  function tokenRow(tokens, cls) {
    return tokens.map(function (t) { return h("span", { "class": "ttok " + (cls || ""), text: t }); });
  }

  function bar(p, color) {
    var fill = h("span", { "class": "fill" });
    fill.style.width = (100 * p).toFixed(1) + "%";
    if (color) fill.style.background = color;
    return h("span", { "class": "track" }, [fill]);
  }

  function renderTeacher(out, tr) {
    var n = tr.read.length;
    out.appendChild(h("div", { "class": "trace-source" }, [h("span", { "class": "olabel", text: T("teacher.source") })].concat(tokenRow(tr.source_tokens, "src"))));

    // (1) the shifted target
    out.appendChild(h("h3", { text: T("teacher.shift_title") }));
    var shift = h("table", { "class": "shift", "data-testid": "teacher-shift" });
    shift.appendChild(h("tr", {}, [h("th", { text: T("teacher.shift_input") })].concat(tr.read.map(function (t) { return h("td", { "class": "ttok in", text: t }); }))));
    shift.appendChild(h("tr", {}, [h("th", { text: T("teacher.shift_target") })].concat(tr.target.map(function (t) { return h("td", { "class": "ttok out", text: t }); }))));
    out.appendChild(h("div", { "class": "tablewrap" }, [shift]));

    // (2) the causal mask, before and after the softmax
    out.appendChild(h("h3", { text: T("teacher.mask_title", { n: n }) }));
    var seg = h("div", { "class": "seg", role: "group", "aria-label": plain("teacher.mask_aria") });
    var before = h("button", { type: "button", "data-testid": "teacher-mask-before", text: T("teacher.mask_before") });
    var after = h("button", { type: "button", "data-testid": "teacher-mask-after", text: T("teacher.mask_after") });
    seg.appendChild(before);
    seg.appendChild(after);
    out.appendChild(h("div", { "class": "controls" }, [seg]));
    var maskBox = h("div", { "class": "tablewrap" });
    var note = h("p", { "class": "caption" });
    out.appendChild(maskBox);
    out.appendChild(note);
    function drawMask(soft) {
      before.setAttribute("aria-pressed", String(!soft));
      after.setAttribute("aria-pressed", String(soft));
      maskBox.textContent = "";
      var grid = D.weightGrid(maskBox, {
        rows: tr.read, cols: tr.read, color: "#2e9a6e", cell: 42, width: 520, aria: plain("teacher.mask_aria"),
        weight: function (i, j) { return j > i ? null : tr.self_weights[i][j]; },
        shade: function (w) { return 0.08 + 0.8 * Math.sqrt(w); },
        text: function (i, j) {
          if (j > i) return soft ? "0" : "\u2212\u221e";
          return soft ? pct(100 * tr.self_weights[i][j], 0) : fmt(tr.self_log_weights[i][j], 1);
        },
        attrs: function (i, j) {
          return { "data-testid": "teacher-mask-cell", "data-i": String(i), "data-j": String(j),
                   "data-weight": String(tr.self_weights[i][j]) };
        }
      });
      grid.setAttribute("data-testid", "teacher-mask");
      grid.setAttribute("data-softmax", String(soft));
      note.innerHTML = T(soft ? "teacher.mask_note_after" : "teacher.mask_note_before");
    }
    before.addEventListener("click", function () { drawMask(false); });
    after.addEventListener("click", function () { drawMask(true); });
    drawMask(false);

    // (3) one teacher-forced pass
    out.appendChild(h("h3", { text: T("teacher.pass_title", { n: n }) }));
    var pass = h("table", { "class": "pass", "data-testid": "teacher-pass" });
    pass.appendChild(h("tr", {}, ["teacher.col_pos", "teacher.col_reads", "teacher.col_predicts", "teacher.col_answer", "teacher.col_p_answer"].map(function (k) { return h("th", { text: T(k) }); })));
    tr.teacher.forEach(function (row, t) {
      var top = row.top[0];
      var right = top[0] === tr.target[t];
      pass.appendChild(h("tr", { "class": right ? "right" : "wrong", "data-testid": "teacher-pass-row" }, [
        h("td", { "class": "num", text: String(t + 1) }),
        h("td", { "class": "ttok in", text: tr.read[t] }),
        h("td", {}, [h("span", { "class": "ttok", text: top[0] }), " " + pct(100 * top[1], 1) + (right ? " ✓" : "")]),
        h("td", { "class": "ttok out", text: tr.target[t] }),
        h("td", { "class": "num", text: pct(100 * row.p_answer, 1) })
      ]));
    });
    out.appendChild(h("div", { "class": "tablewrap" }, [pass]));

    // (4) generating, one step per click
    out.appendChild(h("h3", { text: T("teacher.gen_title") }));
    var next = h("button", { type: "button", "class": "primary", "data-testid": "teacher-next", text: T("teacher.next") });
    var reset = h("button", { type: "button", "data-testid": "teacher-reset", text: T("teacher.reset") });
    out.appendChild(h("div", { "class": "controls" }, [next, reset]));
    var soFar = h("div", { "class": "gen-so-far", "data-testid": "teacher-generated" });
    var stepBox = h("div", { "class": "gen-step", "data-testid": "teacher-step", "aria-live": "polite" });
    out.appendChild(soFar);
    out.appendChild(stepBox);
    var shown = 0;
    function drawSteps() {
      var chosen = tr.steps.slice(0, shown).map(function (st) { return st.chosen; });
      soFar.textContent = "";
      soFar.appendChild(h("span", { "class": "olabel", text: T("teacher.gen_so_far") }));
      tokenRow(["<bos>"].concat(chosen), "in").forEach(function (el) { soFar.appendChild(el); });
      soFar.setAttribute("data-tokens", JSON.stringify(chosen));
      stepBox.textContent = "";
      next.disabled = shown >= tr.steps.length;
      if (shown === 0) { stepBox.appendChild(hx("p", { "class": "label" }, "teacher.gen_start")); return; }
      var st = tr.steps[shown - 1];
      var cands = h("div", { "class": "cands" });
      cands.appendChild(h("p", { "class": "label", text: T("teacher.gen_candidates", { t: shown, k: st.top.length }) }));
      st.top.forEach(function (c) {
        cands.appendChild(h("div", { "class": "cand" + (c[0] === st.chosen ? " chosen" : ""), "data-testid": "teacher-candidate" },
          [h("span", { "class": "ttok", text: c[0] }), bar(c[1]), h("span", { "class": "pct", text: pct(100 * c[1], 1) })]));
      });
      var cross = h("div", { "class": "cands" });
      cross.appendChild(h("p", { "class": "label", text: T("teacher.gen_cross") }));
      st.cross.forEach(function (w, j) {
        cross.appendChild(h("div", { "class": "cand", "data-testid": "teacher-cross" },
          [h("span", { "class": "ttok src", text: tr.source_tokens[j] }), bar(w, "#e07b2e"), h("span", { "class": "pct", text: pct(100 * w, 0) })]));
      });
      stepBox.appendChild(h("div", { "class": "row" }, [cands, cross]));
      if (shown === tr.steps.length) {
        stepBox.appendChild(h("p", { "class": "verdict same", "data-testid": "teacher-done", text: T("teacher.gen_done", { n: shown, text: tr.output }) }));
        stepBox.appendChild(h("p", { "class": "caption", text: T("teacher.gen_same") }));
      }
    }
    next.addEventListener("click", function () { if (shown < tr.steps.length) { shown += 1; drawSteps(); } });
    reset.addEventListener("click", function () { shown = 0; drawSteps(); });
    drawSteps();
  }

  // source: answers.js's, or null (no model anywhere: the figure says how to bring one).
  function initTeacher(source) {
    var body = $("teacher-body");
    if (source && source.trace && source.status.trace === "translation") {
      traceForm(body, source, { aria: "teacher.text_aria", run: "teacher.run", busy: "teacher.busy", model: "teacher.model_live",
                                testid: "teacher-out" }, source.status.default_text || C.SEED_TEXT, renderTeacher);
      return;
    }
    body.appendChild(hx("p", { "class": "label" }, "teacher.no_translator"));
  }

  // ------------------------------------------------------------------ GPT's practice problems
  function renderPractice(out, tr) {
    var table = h("table", { "class": "pass", "data-testid": "practice-table" });
    table.appendChild(h("tr", {}, ["practice.col_prefix", "practice.col_answer", "practice.col_p", "practice.col_top", "practice.col_nll"].map(function (k) { return h("th", { text: T(k) }); })));
    tr.problems.forEach(function (p) {
      table.appendChild(h("tr", { "data-testid": "practice-row", "data-p": String(p.p), "data-nll": String(p.nll) }, [
        h("td", { "class": "ttok in", text: p.prefix.join("") + " →" }),
        h("td", {}, [h("span", { "class": "ttok out", text: p.answer }), p.unknown ? " " + T("practice.unk") : ""]),
        h("td", { "class": "pcell" }, [bar(p.p), h("span", { "class": "pct", text: pct(100 * p.p, 1) })]),
        h("td", { text: p.top.map(function (c) { return c[0] + " " + pct(100 * c[1], 0); }).join(" · ") }),
        h("td", { "class": "num", text: fmt(p.nll, 2) })
      ]));
    });
    out.appendChild(h("div", { "class": "tablewrap" }, [table]));
    out.appendChild(hx("p", { "class": "figline" }, "practice.mean", { nll: fmt(tr.mean_nll, 2), ppl: fmt(Math.exp(tr.mean_nll), 1) }));
  }

  // A GPT live (the page's or the server's); otherwise the recorded example of practice.js.
  function initPractice(source) {
    var body = $("practice-body");
    if (source && source.trace && source.status.trace === "practice") {
      traceForm(body, source, { aria: "practice.text_aria", run: "practice.run", busy: "practice.busy", model: "practice.model_live",
                                testid: "practice-out" }, C.PRACTICE_TEXT, renderPractice);
      return;
    }
    body.appendChild(hx("p", { "class": "label" }, "practice.model_embedded"));
    var out = h("div");
    body.appendChild(out);
    renderPractice(out, globalThis.QKVPracticeExample);
  }

  globalThis.QKVArticleFigures = {
    initCost: initCost, initMultihead: initMultihead, initStack: initStack,
    initTeacher: initTeacher, initPractice: initPractice
  };
})();
