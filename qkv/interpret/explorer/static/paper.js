/*
 * paper.js: the paper's figures 1-5 (Sections 3.2.1, 3.2.2 and 3.5), drawn and wired. The numbers
 * come from figures.js (globalThis.QKVFigures), every word from the catalog (globalThis.QKVLang.T);
 * this file renders them and handles input.
 * Exposed as globalThis.QKVPaperFigures.
 */
(function () {
  "use strict";

  var F = globalThis.QKVFigures;
  var D = globalThis.QKVDraw;
  var T = globalThis.QKVLang.T, plain = globalThis.QKVLang.plain;
  var $ = D.$, h = D.h, s = D.s, setAttrs = D.setAttrs, tokChip = D.tokChip, fmt = D.fmt, pct = D.pct,
      vec = D.vec, tint = D.tint, makePlot = D.makePlot, point = D.point, COLORS = D.COLORS;

  // ------------------------------------------------------------------ figure 1
  function initFig1() {
    var keyPlot = makePlot($("fig1-keys"), { range: 4, label: plain("fig1.keys_aria") });
    var valPlot = makePlot($("fig1-values"), { range: 2, step: 1, label: plain("fig1.values_aria") });

    // Values: the hull first (underneath), then pull lines, points and the output.
    var hull = F.convexHull(F.FIG1_VALUES);
    s("polygon", {
      "class": "hull", "data-testid": "fig1-hull",
      points: hull.map(function (p) { return valPlot.sx(p[0]) + "," + valPlot.sy(p[1]); }).join(" ")
    }, valPlot.svg);
    var pulls = valPlot.layer();
    var pullLines = F.FIG1_VALUES.map(function (v, i) {
      return s("line", { "class": "pull", x1: valPlot.sx(v[0]), y1: valPlot.sy(v[1]), stroke: COLORS[i] }, pulls);
    });
    var vLayer = valPlot.layer();
    F.FIG1_VALUES.forEach(function (v, i) { point(valPlot, vLayer, v, COLORS[i], "v(" + F.TOKENS[i] + ")", 6); });
    var outDot = s("circle", { "class": "output", r: 7.5, "data-testid": "fig1-output" }, valPlot.svg);
    var outLabel = s("text", { "class": "ptlabel", text: "o" }, valPlot.svg);

    // Keys, the |q| circle and the query arrow with its handle.
    var normCircle = s("circle", { "class": "qnorm", cx: keyPlot.sx(0), cy: keyPlot.sy(0) }, keyPlot.svg);
    var kLayer = keyPlot.layer();
    var keyLabelOffsets = [[-66, 4], [9, 16], [-58, -10], [9, -8], [9, -8]]; // keep clear of the arrow
    var keyDots = F.FIG1_KEYS.map(function (k, i) {
      var o = keyLabelOffsets[i];
      return point(keyPlot, kLayer, k, COLORS[i], "k(" + F.TOKENS[i] + ")", 6, o[0], o[1]).dot;
    });
    var arrow = s("line", { "class": "query", x1: keyPlot.sx(0), y1: keyPlot.sy(0) }, keyPlot.svg);
    var head = s("polygon", { "class": "qhead" }, keyPlot.svg);
    var qLabel = s("text", { "class": "ptlabel", fill: COLORS[2], text: "q(他)" }, keyPlot.svg);
    var hit = s("circle", { "class": "hit", r: 22 }, keyPlot.svg);
    var handle = s("circle", {
      "class": "handle", r: 8, tabindex: "0", role: "slider", "data-testid": "fig1-handle",
      "aria-label": plain("fig1.handle_aria")
    }, keyPlot.svg);

    // Bars
    var bars = $("fig1-bars");
    [T("fig1.col_token"), T("fig1.col_score"), T("fig1.col_weight"), ""].forEach(function (t) { bars.appendChild(h("span", { "class": "head", text: t })); });
    var rows = F.TOKENS.map(function (tok, i) {
      var fill = h("div", { "class": "fill" });
      fill.style.background = COLORS[i];
      var row = {
        score: h("span", { "class": "score" }),
        fill: fill,
        pct: h("span", { "class": "pct", "data-testid": "fig1-pct", "data-token": String(i) })
      };
      bars.appendChild(h("span", {}, [tokChip(i)]));
      bars.appendChild(row.score);
      bars.appendChild(h("div", { "class": "track" }, [fill]));
      bars.appendChild(row.pct);
      return row;
    });
    var total = h("span", { "class": "pct total", "data-testid": "fig1-total" });
    bars.appendChild(h("span", { "class": "total head", text: T("fig1.sum") }));
    bars.appendChild(h("span", { "class": "total" }));
    bars.appendChild(h("span", { "class": "total" }));
    bars.appendChild(total);
    var readout = $("fig1-readout");

    var q = F.FIG1_QUERY.slice();

    function update() {
      var r = F.figure1(q);
      var shown = F.roundPercents(r.weights, 1);
      // Arrow from the origin to q, with a head drawn as a small triangle.
      var tx = keyPlot.sx(q[0]), ty = keyPlot.sy(q[1]);
      var len = Math.hypot(q[0], q[1]);
      var ux = len > 1e-9 ? q[0] / len : 1, uy = len > 1e-9 ? -q[1] / len : 0; // screen direction
      var backX = tx - ux * 14, backY = ty - uy * 14;
      setAttrs(arrow, { x2: backX, y2: backY });
      setAttrs(head, {
        points: [tx, ty, backX - uy * 7, backY + ux * 7, backX + uy * 7, backY - ux * 7].join(",")
      });
      setAttrs(handle, { cx: tx, cy: ty, "aria-valuetext": "q = " + vec(q) });
      setAttrs(hit, { cx: tx, cy: ty });
      setAttrs(qLabel, { x: tx + 12, y: ty + 18 });
      setAttrs(normCircle, { r: len * keyPlot.scale });
      keyDots.forEach(function (d, i) { setAttrs(d, { r: 5 + 9 * r.weights[i] }); });
      // Output and the pull of each value on it.
      var ox = valPlot.sx(r.output[0]), oy = valPlot.sy(r.output[1]);
      setAttrs(outDot, { cx: ox, cy: oy, "data-x": r.output[0], "data-y": r.output[1] });
      setAttrs(outLabel, { x: ox + 10, y: oy + 18 });
      pullLines.forEach(function (line, i) {
        setAttrs(line, { x2: ox, y2: oy, "stroke-width": 1 + 7 * r.weights[i], "stroke-opacity": 0.15 + 0.6 * r.weights[i] });
      });
      rows.forEach(function (row, i) {
        row.score.textContent = fmt(r.scores[i], 2);
        row.fill.style.width = (100 * r.weights[i]).toFixed(2) + "%";
        row.pct.textContent = pct(shown[i]);
        row.pct.setAttribute("data-weight", String(r.weights[i]));
      });
      total.textContent = pct(shown.reduce(function (a, b) { return a + b; }, 0));
      readout.textContent = "";
      [["q", vec(q)], ["|q|", fmt(len)], ["o", vec(r.output)]].forEach(function (pair) {
        readout.appendChild(h("div", {}, [h("span", { "class": "dim", text: pair[0] + " = " }), pair[1]]));
      });
    }

    function setQuery(xy) {
      q = F.clampNorm(xy);
      update();
    }

    // Dragging: pressing anywhere on the key plot moves the tip there and keeps following.
    var svg = keyPlot.svg;
    var dragging = false;
    svg.addEventListener("pointerdown", function (e) {
      dragging = true;
      svg.classList.add("dragging");
      try { svg.setPointerCapture(e.pointerId); } catch (err) { /* synthetic events */ }
      setQuery(keyPlot.toData(e));
      e.preventDefault();
    });
    svg.addEventListener("pointermove", function (e) { if (dragging) setQuery(keyPlot.toData(e)); });
    function stop() { dragging = false; svg.classList.remove("dragging"); }
    svg.addEventListener("pointerup", stop);
    svg.addEventListener("pointercancel", stop);
    handle.addEventListener("keydown", function (e) {
      var d = { ArrowLeft: [-0.1, 0], ArrowRight: [0.1, 0], ArrowUp: [0, 0.1], ArrowDown: [0, -0.1] }[e.key];
      if (!d) return;
      setQuery([q[0] + d[0], q[1] + d[1]]);
      e.preventDefault();
    });

    $("fig1-reset").addEventListener("click", function () { setQuery(F.FIG1_QUERY); });
    update();
    return { getQuery: function () { return q.slice(); }, setQuery: setQuery };
  }

  // ------------------------------------------------------------------ figure 2
  function makeBarChart(container, cls, labels) {
    var n = labels.length;
    var W = 320, H = 196, left = 14, right = 8, base = 164, top = 22;
    var svg = s("svg", { "class": "barchart " + cls, viewBox: "0 0 " + W + " " + H, role: "img", "aria-label": plain("fig2.chart_aria", { which: plain("fig2." + cls) }) });
    container.appendChild(svg);
    var slot = (W - left - right) / n;
    s("line", { "class": "base", x1: left, x2: W - right, y1: base, y2: base }, svg);
    var bars = [], pctLabels = [];
    for (var i = 0; i < n; i++) {
      var x = left + i * slot;
      bars.push(s("rect", { "class": "bar", x: x + slot * 0.15, width: slot * 0.7, rx: 3 }, svg));
      pctLabels.push(s("text", { "class": "pctlabel", x: x + slot / 2 }, svg));
      s("text", { "class": "xlabel", x: x + slot / 2, y: base + 16, text: labels[i] }, svg);
    }
    return function update(weights) {
      var shown = F.roundPercents(weights, 1);
      var best = weights.indexOf(Math.max.apply(null, weights));
      weights.forEach(function (w, i) {
        var hgt = Math.max(w * (base - top), 0.5);
        setAttrs(bars[i], { y: base - hgt, height: hgt, "class": "bar" + (i === best ? " max" : "") });
        setAttrs(pctLabels[i], { y: base - hgt - 5, text: shown[i] >= 0.05 ? pct(shown[i], shown[i] >= 10 ? 0 : 1) : "" });
      });
    };
  }

  function initFig2() {
    var slider = $("fig2-dk");
    var seed = F.FIG2_DEFAULT_SEED;
    // Each key is named by a token of the sentence (constants.js FIG2_KEY_TOKENS).
    var keyNames = F.FIG2_KEY_TOKENS.map(function (t) { return "k(" + F.TOKENS[t] + ")"; });
    var drawUnscaled = makeBarChart($("fig2-unscaled"), "unscaled", keyNames);
    var drawScaled = makeBarChart($("fig2-scaled"), "scaled", keyNames);

    function dk() { return F.FIG2_DK_CHOICES[Number(slider.value) - 1]; }

    function update() {
      var d = dk();
      var r = F.figure2(seed, d);
      $("fig2-dk-val").textContent = String(d);
      $("fig2-seed").textContent = T("fig2.seed", { seed: seed });
      drawUnscaled(r.unscaled);
      drawScaled(r.scaled);
      $("fig2-max-unscaled").textContent = pct(100 * r.max_unscaled, 1);
      $("fig2-max-scaled").textContent = pct(100 * r.max_scaled, 1);
      $("fig2-max-unscaled").setAttribute("data-value", String(r.max_unscaled));
      $("fig2-max-scaled").setAttribute("data-value", String(r.max_scaled));
      $("fig2-spread").textContent = T("fig2.spread", {
        n: F.FIG2_N_KEYS, std: fmt(r.dot_std), expected: fmt(r.expected_std), scaled: fmt(r.dot_std / r.expected_std)
      });
      $("fig2-spread").setAttribute("data-expected", String(r.expected_std));
    }

    slider.setAttribute("max", String(F.FIG2_DK_CHOICES.length));
    slider.value = String(F.FIG2_DK_CHOICES.indexOf(F.FIG2_DEFAULT_DK) + 1);
    slider.addEventListener("input", update);
    $("fig2-resample").addEventListener("click", function () { seed += 1; update(); });
    update();
    return { getSeed: function () { return seed; } };
  }

  // ------------------------------------------------------------------ figure 3
  function initFig3() {
    var fig = F.figure3();
    var n = F.TOKENS.length;
    var table = h("table", { "class": "qk", "data-testid": "fig3-table" });
    var corner = h("th", { "class": "corner" });
    corner.innerHTML = T("fig3.corner");
    var headRow = h("tr", {}, [corner]);
    F.TOKENS.forEach(function (t, j) { headRow.appendChild(h("th", { scope: "col" }, [tokChip(j)])); });
    headRow.appendChild(h("th", { "class": "corner sum", text: T("fig3.row_sum") }));
    table.appendChild(h("thead", {}, [headRow]));
    var body = h("tbody");
    var cells = [];
    for (var i = 0; i < n; i++) {
      var tr = h("tr", {}, [h("th", { scope: "row" }, [tokChip(i)])]);
      var shown = F.roundPercents(fig.weights[i], 1);
      cells.push([]);
      for (var j = 0; j < n; j++) {
        var w = fig.weights[i][j];
        var btn = h("button", {
          type: "button", "class": "cell" + (w > 0.45 ? " dark" : ""), "data-testid": "fig3-cell-" + i + "-" + j,
          "data-row": String(i), "data-col": String(j),
          "aria-label": T("fig3.cell_aria", { q: F.TOKENS[i], k: F.TOKENS[j], w: pct(shown[j]), s: fmt(fig.scores[i][j]) })
        }, [h("span", { "class": "w", text: pct(shown[j], 1) }), h("span", { "class": "s", text: "s " + fmt(fig.scores[i][j]) })]);
        btn.style.background = tint("#2f6fd0", 0.08 + 0.92 * w);
        btn.addEventListener("click", select.bind(null, i, j));
        cells[i].push(btn);
        tr.appendChild(h("td", {}, [btn]));
      }
      tr.appendChild(h("td", { "class": "sum", text: pct(shown.reduce(function (a, b) { return a + b; }, 0)) }));
      body.appendChild(tr);
    }
    table.appendChild(body);
    $("fig3-table").appendChild(table);

    var detail = $("fig3-detail");
    function select(i, j) {
      cells.forEach(function (row) { row.forEach(function (c) { c.classList.remove("selected", "transposed"); }); });
      cells[i][j].classList.add("selected");
      if (i !== j) cells[j][i].classList.add("transposed");
      var t = F.dotProductTerms(i, j);
      var back = F.dotProductTerms(j, i);
      var qi = "q(" + F.TOKENS[i] + ")", kj = "k(" + F.TOKENS[j] + ")";
      function par(x) { return x < 0 ? "(" + fmt(x) + ")" : fmt(x); }
      var sum = t.q.map(function (x, c) { return par(x) + "×" + par(t.k[c]); }).join(" + ");
      detail.textContent = "";
      detail.appendChild(h("div", {}, [h("b", { text: T("fig3.detail_query") }), tokChip(i), h("b", { text: T("fig3.detail_key") }), tokChip(j)]));
      detail.appendChild(h("div", { "class": "eq", "data-testid": "fig3-q", text: qi + " = x(" + F.TOKENS[i] + ")·W_Q = " + vec(t.q) }));
      detail.appendChild(h("div", { "class": "eq", "data-testid": "fig3-k", text: kj + " = x(" + F.TOKENS[j] + ")·W_K = " + vec(t.k) }));
      detail.appendChild(h("div", { "class": "eq" }, [
        document.createTextNode(qi + "·" + kj + " = " + sum + " = "),
        h("b", { "data-testid": "fig3-dot", "data-value": String(t.dot), text: fmt(t.dot, 4) })
      ]));
      detail.appendChild(h("div", { "class": "eq", "data-testid": "fig3-score", "data-value": String(t.score),
        text: T("fig3.score_line", { dot: fmt(t.dot, 4), score: fmt(t.score, 4), pct: pct(100 * fig.weights[i][j]), tok: F.TOKENS[i] }) }));
      var note = h("div", { "class": "note", "data-testid": "fig3-transposed" });
      if (i === j) {
        note.appendChild(document.createTextNode(T("fig3.diagonal", { tok: F.TOKENS[i] })));
      } else {
        note.appendChild(document.createTextNode(T("fig3.transposed", { a: F.TOKENS[i], b: F.TOKENS[j] })));
        note.appendChild(h("b", { text: fmt(back.score, 4) }));
        note.appendChild(document.createTextNode(back.score.toFixed(4) === t.score.toFixed(4)
          ? T("fig3.by_chance") : T("fig3.not_symmetric", { score: fmt(t.score, 4) })));
      }
      detail.appendChild(note);
    }
    select(F.QUERY_TOKEN, 0); // 他 looking at 小明
    // Row 3 is figure 1's 他: the same query, the same keys, the same weight on 小明.
    var rowNote = $("fig3-row-note");
    rowNote.textContent = T("fig3.row_note", { pct: pct(F.roundPercents(fig.weights[F.QUERY_TOKEN], 1)[0]) });
    rowNote.setAttribute("data-weight", String(fig.weights[F.QUERY_TOKEN][0]));
    return { select: select };
  }

  // ------------------------------------------------------------------ figure 4
  function initFig4() {
    var one = makePlot($("fig4-one"), { range: 2, size: 320, label: plain("fig4.one_aria") });
    var V = F.FIG4_ONE_HEAD_VALUES;
    s("line", { "class": "segment", x1: one.sx(V[0][0]), y1: one.sy(V[0][1]), x2: one.sx(V[1][0]), y2: one.sy(V[1][1]) }, one.svg);
    point(one, one.svg, V[0], COLORS[0], "v(小明)", 7, -30, 28);
    point(one, one.svg, V[1], COLORS[1], "v(累了)", 7, -30, -14);
    var oOne = s("circle", { "class": "output", r: 8, "data-testid": "fig4-one-output" }, one.svg);
    var oOneLabel = s("text", { "class": "ptlabel", text: "o" }, one.svg);

    var heads = [1, 2].map(function (k) {
      var hv = F.FIG4_HEAD_VALUES[k - 1];
      var container = $("fig4-head" + k);
      container.appendChild(h("p", { "class": "label", text: T("fig4.head_label", { k: k, a: 2 * k - 1, b: 2 * k }) }));
      $("fig4-split" + k + "-label").textContent = T("fig4.head_on_xiaoming", { k: k });
      var p = makePlot(container, { range: 2, size: 260, label: T("fig4.head_aria", { k: k }) });
      s("line", { "class": "segment", x1: p.sx(hv[0][0]), y1: p.sy(hv[0][1]), x2: p.sx(hv[1][0]), y2: p.sy(hv[1][1]) }, p.svg);
      point(p, p.svg, hv[0], COLORS[0], "小明", 7, -16, -13);
      point(p, p.svg, hv[1], COLORS[1], "累了", 7, -16, -13);
      var dot = s("circle", { "class": "output", r: 8, "data-testid": "fig4-head" + k + "-output" }, p.svg);
      var lab = s("text", { "class": "ptlabel", text: "o" + (k === 1 ? "₁" : "₂") }, p.svg);
      return { plot: p, dot: dot, label: lab };
    });

    function dist(a, b) { return Math.hypot(a[0] - b[0], a[1] - b[1]); }

    function update() {
      var a = Number($("fig4-split").value) / 100;
      var a1 = Number($("fig4-split1").value) / 100;
      var a2 = Number($("fig4-split2").value) / 100;
      $("fig4-split-val").textContent = pct(100 * a, 0);
      $("fig4-split1-val").textContent = pct(100 * a1, 0);
      $("fig4-split2-val").textContent = pct(100 * a2, 0);
      var o = F.oneHeadOutput(a);
      setAttrs(oOne, { cx: one.sx(o[0]), cy: one.sy(o[1]) });
      setAttrs(oOneLabel, { x: one.sx(o[0]) + 10, y: one.sy(o[1]) + 20 });
      $("fig4-one-readout").textContent = T("fig4.readout", {
        o: vec(o), d1: fmt(dist(o, V[0])), d2: fmt(dist(o, V[1])), sum: fmt(dist(V[0], V[1]))
      });
      var two = F.twoHeadOutput(a1, a2);
      heads.forEach(function (hd, k) {
        var p = hd.plot, oh = two.heads[k];
        setAttrs(hd.dot, { cx: p.sx(oh[0]), cy: p.sy(oh[1]) });
        setAttrs(hd.label, { x: p.sx(oh[0]) + 10, y: p.sy(oh[1]) + 20 });
      });
      $("fig4-concat").textContent = T("fig4.concat", { v: vec(two.concat) });
    }
    ["fig4-split", "fig4-split1", "fig4-split2"].forEach(function (id) { $(id).addEventListener("input", update); });
    $("fig4-split").value = String(Math.round(100 * F.FIG4_DEFAULT_SPLIT));
    $("fig4-split1").value = String(Math.round(100 * F.FIG4_DEFAULT_HEAD_SPLITS[0]));
    $("fig4-split2").value = String(Math.round(100 * F.FIG4_DEFAULT_HEAD_SPLITS[1]));
    update();
  }

  // ------------------------------------------------------------------ figure 5
  function initClocks() {
    var nClocks = F.FIG5_D_MODEL / 2;
    var steps = F.stepsPerTurn();
    // 6.3 for the fastest hand, 19,869 for the slowest: a decimal while it matters, thousands grouped.
    function stepsText(x) { return x < 100 ? x.toFixed(1) : Math.round(x).toLocaleString("en-US"); }
    $("fig5-hands").innerHTML = T("fig5.hands", { fast: stepsText(steps[0]), slow: stepsText(steps[steps.length - 1]) });
    var box = $("fig5-clocks");
    var cx = 50, cy = 50, R = 40;
    function tip(angle, r) { return [cx + r * Math.sin(angle), cy - r * Math.cos(angle)]; }
    var clocks = [];
    for (var i = 0; i < nClocks; i++) {
      var svg = s("svg", { viewBox: "0 0 100 100", role: "img", "aria-label": T("fig5.clock_aria", { i: i }) });
      s("circle", { "class": "face", cx: cx, cy: cy, r: R + 4 }, svg);
      for (var m = 0; m < 12; m++) {
        var a = m * Math.PI / 6, p1 = tip(a, R + 1), p2 = tip(a, R - (m % 3 === 0 ? 6 : 3));
        s("line", { "class": "tickmark", x1: p1[0], y1: p1[1], x2: p2[0], y2: p2[1] }, svg);
      }
      var arc = s("path", { "class": "arc" }, svg);
      var ghost = s("line", { "class": "ghost", x1: cx, y1: cy }, svg);
      var hand = s("line", { "class": "hand", x1: cx, y1: cy }, svg);
      s("circle", { "class": "hub", cx: cx, cy: cy, r: 3.5 }, svg);
      var turn = h("div", { "class": "turn", "data-testid": "fig5-turn", "data-clock": String(i) });
      var pe = h("div", { "class": "name" });
      box.appendChild(h("div", { "class": "clock" }, [
        svg,
        h("div", { "class": "name", "data-testid": "fig5-steps", "data-steps": String(steps[i]), text: T("fig5.clock_name", { i: i, steps: stepsText(steps[i]) }) }),
        pe, turn
      ]));
      clocks.push({ arc: arc, ghost: ghost, hand: hand, turn: turn, pe: pe });
    }

    function update() {
      var pos = Number($("fig5-pos").value), k = Number($("fig5-k").value);
      $("fig5-pos-val").textContent = String(pos);
      $("fig5-k-val").textContent = String(k);
      var angles = F.clockAngles(pos), shifts = F.shiftAngles(k), pe = F.sinusoidalPE(pos);
      clocks.forEach(function (c, i) {
        var a0 = angles[i], a1 = a0 + shifts[i];
        var p0 = tip(a0, R - 6), p1 = tip(a1, R - 10);
        setAttrs(c.hand, { x2: p0[0], y2: p0[1], "data-angle": String(a0) });
        setAttrs(c.ghost, { x2: p1[0], y2: p1[1] });
        var q0 = tip(a0, R + 4), q1 = tip(a1, R + 4);
        var large = shifts[i] > Math.PI ? 1 : 0;
        setAttrs(c.arc, { d: shifts[i] < 1e-3 ? "" : "M" + q0[0] + "," + q0[1] + " A" + (R + 4) + "," + (R + 4) + " 0 " + large + " 1 " + q1[0] + "," + q1[1] });
        c.pe.textContent = "(" + fmt(pe[2 * i]) + ", " + fmt(pe[2 * i + 1]) + ")";
        c.turn.textContent = T("fig5.turn", { deg: (shifts[i] * 180 / Math.PI).toFixed(1) });
        c.turn.setAttribute("data-radians", String(shifts[i]));
      });
    }
    $("fig5-pos").setAttribute("max", String(F.FIG5_MAX_POS));
    $("fig5-pos").addEventListener("input", update);
    $("fig5-k").addEventListener("input", update);
    update();
  }

  function initWordOrder() {
    var n = F.TOKENS.length;
    var selA = $("fig5-swap-a"), selB = $("fig5-swap-b");
    [selA, selB].forEach(function (sel) {
      F.TOKENS.forEach(function (t, i) { sel.appendChild(h("option", { value: String(i), text: (i + 1) + " · " + t })); });
    });
    selA.value = "0";
    selB.value = String(F.QUERY_TOKEN);
    var scatterBox = $("fig5-scatter");
    var labelOffsets = [[-38, -10], [-40, 24], [10, 20], [10, -10], [-42, 5]];
    var tableBox = $("fig5-table");

    // The plot is redrawn with a range that fits the points (PE moves them much further).
    function drawScatter(before, byToken) {
      var far = 0;
      before.concat(byToken).forEach(function (o) { far = Math.max(far, Math.abs(o[0]), Math.abs(o[1])); });
      var range = far <= 0.9 ? 1 : Math.ceil(far * 1.15 * 2) / 2;
      scatterBox.textContent = "";
      var plot = makePlot(scatterBox, { range: range, step: range <= 1.5 ? 0.5 : 1, size: 320, label: plain("fig5.scatter_aria") });
      var links = plot.layer();
      for (var t = 0; t < n; t++) {
        var o0 = before[t], o1 = byToken[t];
        s("line", { stroke: COLORS[t], "stroke-width": 2, "stroke-dasharray": "3 3",
          x1: plot.sx(o0[0]), y1: plot.sy(o0[1]), x2: plot.sx(o1[0]), y2: plot.sy(o1[1]) }, links);
        s("circle", { r: 9, fill: "none", stroke: COLORS[t], "stroke-width": 2.5, cx: plot.sx(o0[0]), cy: plot.sy(o0[1]) }, plot.svg);
      }
      for (t = 0; t < n; t++) {
        point(plot, plot.svg, byToken[t], COLORS[t], F.TOKENS[t], 5, labelOffsets[t][0], labelOffsets[t][1]);
      }
    }

    function update() {
      var a = Number(selA.value), b = Number(selB.value), usePE = $("fig5-pe").checked;
      var order = F.TOKENS.map(function (_, k) { return k; });
      var after = F.swapped(order, a, b);
      var before = F.wordOrderOutputs(order, usePE);
      var out = F.wordOrderOutputs(after, usePE);
      var byToken = [];
      after.forEach(function (tok, p) { byToken[tok] = out[p]; });
      drawScatter(before, byToken);
      var table = h("table", { "class": "outputs", "data-testid": "fig5-outputs" });
      table.appendChild(h("tr", {}, [T("fig5.col_pos"), T("fig5.col_token"), T("fig5.col_now"), T("fig5.col_before"), ""].map(function (t) { return h("th", { text: t }); })));
      var worst = 0;
      after.forEach(function (tok, p) {
        var change = Math.max(Math.abs(out[p][0] - before[tok][0]), Math.abs(out[p][1] - before[tok][1]));
        worst = Math.max(worst, change);
        var same = change < 1e-9;
        table.appendChild(h("tr", { "class": same ? "same" : "changed" }, [
          h("td", { text: String(p + 1) }), h("td", {}, [tokChip(tok)]),
          h("td", { "class": "num", text: vec(out[p]) }), h("td", { "class": "num", text: vec(before[tok]) }),
          h("td", { "class": "flag", text: same ? T("fig5.same") : "Δ " + fmt(change) })
        ]));
      });
      tableBox.textContent = "";
      tableBox.appendChild(table);
      var verdict = $("fig5-verdict");
      verdict.setAttribute("data-change", String(worst));
      verdict.className = "verdict " + (worst < 1e-9 ? "same" : "changed");
      verdict.textContent = a === b
        ? T("fig5.pick_two")
        : T(worst < 1e-9 ? "fig5.verdict_same" : "fig5.verdict_changed", { x: fmt(worst, 3) });
    }
    [selA, selB, $("fig5-pe")].forEach(function (node) { node.addEventListener("change", update); });
    update();
  }

  globalThis.QKVPaperFigures = { initFig1: initFig1, initFig2: initFig2, initFig3: initFig3, initFig4: initFig4, initClocks: initClocks, initWordOrder: initWordOrder };
})();
