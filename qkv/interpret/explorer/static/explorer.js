/*
 * explorer.js: draws and wires the explorer page's figures (SVG + DOM, no framework).
 * The numbers come from figures.js (globalThis.QKVFigures); this file only renders them and
 * handles input. Figure 6 reads a model's attention maps from the server's /api/attention, or from
 * the JSON embedded in an exported page (script#qkv-model-data); it never fetches from file://.
 */
(function () {
  "use strict";

  var F = globalThis.QKVFigures;
  var SVGNS = "http://www.w3.org/2000/svg";
  var COLORS = ["#2f6fd0", "#e07b2e", "#2e9a6e", "#8a62c4", "#d24b5a"]; // as --tok0..4 in style.css

  // ------------------------------------------------------------------ DOM helpers
  function $(id) { return document.getElementById(id); }

  function h(tag, attrs, children) {
    var node = document.createElement(tag);
    setAttrs(node, attrs);
    (children || []).forEach(function (c) {
      node.appendChild(typeof c === "string" ? document.createTextNode(c) : c);
    });
    return node;
  }

  function s(tag, attrs, parent) {
    var node = document.createElementNS(SVGNS, tag);
    setAttrs(node, attrs);
    if (parent) parent.appendChild(node);
    return node;
  }

  function setAttrs(node, attrs) {
    Object.keys(attrs || {}).forEach(function (k) {
      if (k === "text") node.textContent = attrs[k];
      else if (attrs[k] !== null && attrs[k] !== undefined) node.setAttribute(k, attrs[k]);
    });
  }

  function tokChip(i, text) {
    return h("span", { "class": "tok t" + i, text: text === undefined ? F.TOKENS[i] : text });
  }

  // Numbers with a typographic minus, and no "-0.00".
  function fmt(x, d) {
    if (d === undefined) d = 2;
    var t = x.toFixed(d);
    if (Number(t) === 0) t = (0).toFixed(d);
    return t.replace("-", "\u2212");
  }

  function pct(p, d) { return p.toFixed(d === undefined ? 1 : d) + "%"; }

  function vec(v, d) { return "[" + v.map(function (x) { return fmt(x, d); }).join(", ") + "]"; }

  // Mix white into a colour: t = 0 gives white, t = 1 the colour.
  function tint(hex, t) {
    var n = parseInt(hex.slice(1), 16);
    var rgb = [(n >> 16) & 255, (n >> 8) & 255, n & 255].map(function (c) {
      return Math.round(255 + (c - 255) * t);
    });
    return "rgb(" + rgb.join(",") + ")";
  }

  // ------------------------------------------------------------------ a 2-D plot with axes
  function makePlot(container, opts) {
    var size = opts.size || 360;
    var pad = opts.pad === undefined ? 16 : opts.pad;
    var range = opts.range;
    var scale = (size / 2 - pad) / range;
    var svg = s("svg", {
      "class": "plot", viewBox: "0 0 " + size + " " + size, role: "img",
      "aria-label": opts.label || "plot"
    });
    container.appendChild(svg);
    function sx(x) { return size / 2 + x * scale; }
    function sy(y) { return size / 2 - y * scale; }
    var grid = s("g", {}, svg);
    var step = opts.step || 1;
    for (var t = -Math.floor(range / step) * step; t <= range + 1e-9; t += step) {
      if (Math.abs(t) < 1e-9) continue;
      s("line", { "class": "gridline", x1: sx(t), y1: sy(-range), x2: sx(t), y2: sy(range) }, grid);
      s("line", { "class": "gridline", x1: sx(-range), y1: sy(t), x2: sx(range), y2: sy(t) }, grid);
      var dec = step < 1 ? 1 : 0;
      s("text", { "class": "tick", x: sx(t), y: sy(0) + 13, "text-anchor": "middle", text: fmt(t, dec) }, grid);
      s("text", { "class": "tick", x: sx(0) - 5, y: sy(t) + 3, "text-anchor": "end", text: fmt(t, dec) }, grid);
    }
    s("line", { "class": "axis", x1: sx(-range), y1: sy(0), x2: sx(range), y2: sy(0) }, grid);
    s("line", { "class": "axis", x1: sx(0), y1: sy(-range), x2: sx(0), y2: sy(range) }, grid);
    return {
      svg: svg, sx: sx, sy: sy, scale: scale,
      layer: function () { return s("g", {}, svg); },
      toData: function (evt) {
        var pt = svg.createSVGPoint();
        pt.x = evt.clientX; pt.y = evt.clientY;
        var p = pt.matrixTransform(svg.getScreenCTM().inverse());
        return [(p.x - size / 2) / scale, (size / 2 - p.y) / scale];
      }
    };
  }

  // A labelled point; returns {dot, label}.
  function point(plot, parent, xy, color, text, r, labelDx, labelDy) {
    var dot = s("circle", { cx: plot.sx(xy[0]), cy: plot.sy(xy[1]), r: r || 6, fill: color }, parent);
    var label = s("text", {
      "class": "ptlabel", x: plot.sx(xy[0]) + (labelDx === undefined ? 9 : labelDx),
      y: plot.sy(xy[1]) + (labelDy === undefined ? -8 : labelDy), fill: color, text: text
    }, parent);
    return { dot: dot, label: label };
  }

  // ------------------------------------------------------------------ figure 1
  function initFig1() {
    var keyPlot = makePlot($("fig1-keys"), { range: 4, label: "keys and the query of 他" });
    var valPlot = makePlot($("fig1-values"), { range: 2, step: 1, label: "values and the output" });

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
    var keyLabelOffsets = [[-62, -12], [9, -8], [4, 24], [9, -8], [9, -8]]; // keep clear of the arrow
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
      "aria-label": "query of 他: drag, or use the arrow keys"
    }, keyPlot.svg);

    // Bars
    var bars = $("fig1-bars");
    ["token", "q·k/√d", "weight", ""].forEach(function (t) { bars.appendChild(h("span", { "class": "head", text: t })); });
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
    bars.appendChild(h("span", { "class": "total head", text: "sum" }));
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

    update();
    return { getQuery: function () { return q.slice(); }, setQuery: setQuery };
  }

  // ------------------------------------------------------------------ figure 2
  function makeBarChart(container, cls, n) {
    var W = 320, H = 196, left = 14, right = 8, base = 164, top = 22;
    var svg = s("svg", { "class": "barchart " + cls, viewBox: "0 0 " + W + " " + H, role: "img", "aria-label": cls + " softmax weights" });
    container.appendChild(svg);
    var slot = (W - left - right) / n;
    s("line", { "class": "base", x1: left, x2: W - right, y1: base, y2: base }, svg);
    var bars = [], labels = [];
    for (var i = 0; i < n; i++) {
      var x = left + i * slot;
      bars.push(s("rect", { "class": "bar", x: x + slot * 0.15, width: slot * 0.7, rx: 3 }, svg));
      labels.push(s("text", { "class": "pctlabel", x: x + slot / 2 }, svg));
      s("text", { "class": "xlabel", x: x + slot / 2, y: base + 16, text: "k" + (i + 1) }, svg);
    }
    return function update(weights) {
      var shown = F.roundPercents(weights, 1);
      var best = weights.indexOf(Math.max.apply(null, weights));
      weights.forEach(function (w, i) {
        var hgt = Math.max(w * (base - top), 0.5);
        setAttrs(bars[i], { y: base - hgt, height: hgt, "class": "bar" + (i === best ? " max" : "") });
        setAttrs(labels[i], { y: base - hgt - 5, text: shown[i] >= 0.05 ? pct(shown[i], shown[i] >= 10 ? 0 : 1) : "" });
      });
    };
  }

  function initFig2() {
    var slider = $("fig2-dk");
    var seed = F.FIG2_DEFAULT_SEED;
    var drawUnscaled = makeBarChart($("fig2-unscaled"), "unscaled", F.FIG2_N_KEYS);
    var drawScaled = makeBarChart($("fig2-scaled"), "scaled", F.FIG2_N_KEYS);

    function dk() { return F.FIG2_DK_CHOICES[Number(slider.value) - 1]; }

    function update() {
      var d = dk();
      var r = F.figure2(seed, d);
      $("fig2-dk-val").textContent = String(d);
      $("fig2-seed").textContent = "seed " + seed;
      drawUnscaled(r.unscaled);
      drawScaled(r.scaled);
      $("fig2-max-unscaled").textContent = pct(100 * r.max_unscaled, 2);
      $("fig2-max-scaled").textContent = pct(100 * r.max_scaled, 2);
      $("fig2-max-unscaled").setAttribute("data-value", String(r.max_unscaled));
      $("fig2-max-scaled").setAttribute("data-value", String(r.max_scaled));
      $("fig2-spread").textContent = "Here the " + F.FIG2_N_KEYS + " unscaled scores q·k spread with a standard deviation of " +
        fmt(r.dot_std) + " (expected √d_k = " + fmt(Math.sqrt(d)) + "); divided by √d_k they spread by " +
        fmt(r.dot_std / Math.sqrt(d)) + " (expected 1), whatever d_k is.";
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
    var headRow = h("tr", {}, [h("th", { "class": "corner" }, ["query ↓", h("br"), "key →"])]);
    F.TOKENS.forEach(function (t, j) { headRow.appendChild(h("th", { scope: "col" }, [tokChip(j)])); });
    headRow.appendChild(h("th", { "class": "corner sum", text: "row sum" }));
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
          "aria-label": "query " + F.TOKENS[i] + ", key " + F.TOKENS[j] + ": weight " + pct(shown[j]) + ", score " + fmt(fig.scores[i][j])
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
      detail.appendChild(h("div", {}, [h("b", { text: "query " }), tokChip(i), h("b", { text: "  ·  key " }), tokChip(j)]));
      detail.appendChild(h("div", { "class": "eq", "data-testid": "fig3-q", text: qi + " = x(" + F.TOKENS[i] + ")·W_Q = " + vec(t.q) }));
      detail.appendChild(h("div", { "class": "eq", "data-testid": "fig3-k", text: kj + " = x(" + F.TOKENS[j] + ")·W_K = " + vec(t.k) }));
      detail.appendChild(h("div", { "class": "eq" }, [
        document.createTextNode(qi + "·" + kj + " = " + sum + " = "),
        h("b", { "data-testid": "fig3-dot", "data-value": String(t.dot), text: fmt(t.dot, 4) })
      ]));
      detail.appendChild(h("div", { "class": "eq", "data-testid": "fig3-score", "data-value": String(t.score),
        text: "score = " + fmt(t.dot, 4) + " / √3 = " + fmt(t.score, 4) + "  →  " + pct(100 * fig.weights[i][j]) + " of row " + F.TOKENS[i] }));
      var note = h("div", { "class": "note", "data-testid": "fig3-transposed" });
      if (i === j) {
        note.appendChild(document.createTextNode("A diagonal cell: " + F.TOKENS[i] + "’s query against its own key."));
      } else {
        note.appendChild(document.createTextNode("Transposed cell (dashed): q(" + F.TOKENS[j] + ")·k(" + F.TOKENS[i] + ")/√3 = "));
        note.appendChild(h("b", { text: fmt(back.score, 4) }));
        note.appendChild(document.createTextNode(back.score.toFixed(4) === t.score.toFixed(4)
          ? " — equal here by chance." : " ≠ " + fmt(t.score, 4) + ": attention is not symmetric."));
      }
      detail.appendChild(note);
    }
    select(F.QUERY_TOKEN, 0); // 他 looking at 小明
    return { select: select };
  }

  // ------------------------------------------------------------------ figure 4
  function initFig4() {
    var one = makePlot($("fig4-one"), { range: 2, size: 320, label: "one head" });
    var V = F.FIG4_ONE_HEAD_VALUES;
    s("line", { "class": "segment", x1: one.sx(V[0][0]), y1: one.sy(V[0][1]), x2: one.sx(V[1][0]), y2: one.sy(V[1][1]) }, one.svg);
    point(one, one.svg, V[0], COLORS[0], "v(小明)", 7, -30, -14);
    point(one, one.svg, V[1], COLORS[1], "v(累了)", 7, -30, 28);
    var oOne = s("circle", { "class": "output", r: 8, "data-testid": "fig4-one-output" }, one.svg);
    var oOneLabel = s("text", { "class": "ptlabel", text: "o" }, one.svg);

    var heads = [1, 2].map(function (k) {
      var hv = F.FIG4_HEAD_VALUES[k - 1];
      var container = $("fig4-head" + k);
      container.appendChild(h("p", { "class": "label", text: "head " + k + " → dims " + (2 * k - 1) + "–" + (2 * k) + " of the concatenation" }));
      var p = makePlot(container, { range: 2, size: 260, label: "head " + k });
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
      $("fig4-one-readout").textContent = "o = " + vec(o) + "   distance to v(小明) " + fmt(dist(o, V[0])) +
        ", to v(累了) " + fmt(dist(o, V[1])) + "   (they always add up to " + fmt(dist(V[0], V[1])) + ")";
      var two = F.twoHeadOutput(a1, a2);
      heads.forEach(function (hd, k) {
        var p = hd.plot, oh = two.heads[k];
        setAttrs(hd.dot, { cx: p.sx(oh[0]), cy: p.sy(oh[1]) });
        setAttrs(hd.label, { x: p.sx(oh[0]) + 10, y: p.sy(oh[1]) + 20 });
      });
      $("fig4-concat").textContent = "concat[o₁; o₂] = " + vec(two.concat);
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
    var freqs = F.clockFrequencies();
    var box = $("fig5-clocks");
    var cx = 50, cy = 50, R = 40;
    function tip(angle, r) { return [cx + r * Math.sin(angle), cy - r * Math.cos(angle)]; }
    var clocks = [];
    for (var i = 0; i < nClocks; i++) {
      var svg = s("svg", { viewBox: "0 0 100 100", role: "img", "aria-label": "clock " + i });
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
        h("div", { "class": "name", text: "i=" + i + " · ω=" + (freqs[i] >= 0.01 ? freqs[i].toPrecision(2) : freqs[i].toExponential(1)) }),
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
        c.turn.textContent = "turn " + (shifts[i] * 180 / Math.PI).toFixed(1) + "°";
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
      var plot = makePlot(scatterBox, { range: range, step: range <= 1.5 ? 0.5 : 1, size: 320, label: "outputs before and after the swap" });
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
      table.appendChild(h("tr", {}, ["pos", "token", "output now", "before the swap", ""].map(function (t) { return h("th", { text: t }); })));
      var worst = 0;
      after.forEach(function (tok, p) {
        var change = Math.max(Math.abs(out[p][0] - before[tok][0]), Math.abs(out[p][1] - before[tok][1]));
        worst = Math.max(worst, change);
        var same = change < 1e-9;
        table.appendChild(h("tr", { "class": same ? "same" : "changed" }, [
          h("td", { text: String(p + 1) }), h("td", {}, [tokChip(tok)]),
          h("td", { "class": "num", text: vec(out[p]) }), h("td", { "class": "num", text: vec(before[tok]) }),
          h("td", { "class": "flag", text: same ? "same ✓" : "Δ " + fmt(change) })
        ]));
      });
      tableBox.textContent = "";
      tableBox.appendChild(table);
      var verdict = $("fig5-verdict");
      verdict.setAttribute("data-change", String(worst));
      verdict.className = "verdict " + (worst < 1e-9 ? "same" : "changed");
      verdict.textContent = a === b
        ? "Pick two different positions to swap."
        : worst < 1e-9
          ? "Largest change of any token’s output: " + fmt(worst, 3) + ". The outputs were only reordered — without positions, self-attention sees a bag of words."
          : "Largest change of any token’s output: " + fmt(worst, 3) + ". With positional encoding, the same word in a new place computes something new.";
    }
    [selA, selB, $("fig5-pe")].forEach(function (node) { node.addEventListener("change", update); });
    update();
  }

  // ------------------------------------------------------------------ figure 6
  // A model's maps, grouped by kind and layer, in three linked views: the head view (lines from
  // queries to keys, one colour per head, opacity = weight, as in bertviz), the model view (a
  // small map per layer and head) and the detail heat map of one head.
  var KIND_ORDER = ["encoder_self", "decoder_self", "cross", "self"];
  var KIND_LABELS = { encoder_self: "encoder self", decoder_self: "decoder self", cross: "cross", self: "self" };
  var KIND_NOTES = {
    encoder_self: "Encoder self-attention: each source token looks at every source token.",
    decoder_self: "Decoder self-attention: each target token looks at itself and the target tokens before it (masked).",
    cross: "Cross-attention (encoder–decoder): each target token looks at the source tokens.",
    self: "Causal self-attention: each token looks at itself and the tokens before it."
  };
  var HEAD_COLORS = ["#2f6fd0", "#e07b2e", "#2e9a6e", "#8a62c4", "#d24b5a", "#1b93a5",
    "#b0862a", "#c8559e", "#55708f", "#6f9a2a", "#9b5a3c", "#4955b8"];
  var MEAN_COLOR = "#4a5566";
  var HV_MAX_LINES = 12000; // SVG lines in the head view; more make hovering sluggish.
  var HV_THRESHOLDS = [0.001, 0.003, 0.01, 0.03, 0.1, 0.3];
  var THUMB_PX = 144; // model-view maps are drawn at up to 144 px and shown at ~80 CSS px (sharp on HiDPI)
  // Choices survive a new "Show attention": the user keeps looking at the same kind, layer, heads.
  var fig6Memory = { kind: null, layer: null, head: null, active: null };

  function headColor(k) {
    if (k < HEAD_COLORS.length) return HEAD_COLORS[k];
    return hslHex((k * 137.508) % 360, 0.55, 0.45); // golden-angle hues stay apart for any head count
  }

  function hslHex(hue, sat, light) {
    var c = (1 - Math.abs(2 * light - 1)) * sat, x = c * (1 - Math.abs((hue / 60) % 2 - 1)), m = light - c / 2;
    var rgb = hue < 60 ? [c, x, 0] : hue < 120 ? [x, c, 0] : hue < 180 ? [0, c, x] :
      hue < 240 ? [0, x, c] : hue < 300 ? [x, 0, c] : [c, 0, x];
    return "#" + rgb.map(function (v) { return ("0" + Math.round((v + m) * 255).toString(16)).slice(-2); }).join("");
  }

  function rgbOf(hex) {
    var n = parseInt(hex.slice(1), 16);
    return [(n >> 16) & 255, (n >> 8) & 255, n & 255];
  }

  function clamp01(x) { return Math.min(1, Math.max(0, x)); }

  function shorten(t, n) { return t.length > n ? t.slice(0, n - 1) + "…" : t; }

  // {order: [kind...], byKind: {kind: {kind, label, layers: [sorted], byLayer: {layer: map}, nHeads}}}.
  // kind and layer come from the payload, or else from names like "decoder self · layer 1".
  function groupMaps(maps) {
    var byKind = {}, order = [];
    maps.forEach(function (m) {
      var kind = m.kind, layer = m.layer;
      if (kind === undefined || layer === undefined) {
        var match = /^(.*?)\s*·\s*layer\s+(\d+)\s*$/i.exec(m.name);
        if (kind === undefined) kind = match ? match[1].trim().toLowerCase().replace(/[\s-]+/g, "_") : m.name;
        if (layer === undefined && match) layer = Number(match[2]);
      }
      var g = byKind[kind];
      if (!g) {
        g = byKind[kind] = { kind: kind, label: KIND_LABELS[kind] || kind.replace(/_/g, " "), byLayer: {}, layers: [], nHeads: 0 };
        order.push(kind);
      }
      if (layer === undefined || g.byLayer[layer] !== undefined) {
        layer = g.layers.length ? Math.max.apply(null, g.layers) + 1 : 0;
      }
      g.byLayer[layer] = m;
      g.layers.push(layer);
      g.nHeads = Math.max(g.nHeads, m.weights.length);
    });
    var seen = order.slice();
    function rank(k) { var i = KIND_ORDER.indexOf(k); return i >= 0 ? i : KIND_ORDER.length + seen.indexOf(k); }
    order.forEach(function (k) { byKind[k].layers.sort(function (a, b) { return a - b; }); });
    order.sort(function (a, b) { return rank(a) - rank(b); });
    return { order: order, byKind: byKind };
  }

  function initFig6() {
    var body = $("fig6-body");
    var embedded = $("qkv-model-data");
    if (embedded) {
      var data;
      try {
        data = JSON.parse(embedded.textContent);
      } catch (err) {
        showError(body, "The embedded model data is not valid JSON: " + err.message);
        return;
      }
      body.textContent = "";
      body.appendChild(h("p", { "class": "caption", text: "Exported page: the maps below were computed for one fixed text. Run qkv explore --run DIR for any text." }));
      return renderModel(body, data, { showInput: true });
    }
    // fetch() does not work from file://, and an exported page has no server: keep the placeholder.
    if (location.protocol !== "http:" && location.protocol !== "https:") return;
    fetch("/api/status").then(function (r) { return r.json(); }).then(function (st) {
      if (st && st.model) setupLive(body, st);
    }).catch(function (err) { showError(body, "Could not reach the explorer server: " + err.message); });
  }

  function showError(parent, message) {
    var old = parent.querySelector(".error");
    if (old) old.remove();
    parent.appendChild(h("p", { "class": "error", role: "alert", "data-testid": "fig6-error", text: message }));
  }

  function setupLive(body, status) {
    body.textContent = "";
    var input = h("input", {
      type: "text", id: "fig6-text", maxlength: String(status.max_text_chars || 500),
      placeholder: "Type a sentence", "aria-label": "text to run through the model"
    });
    input.value = status.default_text || "";
    var button = h("button", { type: "submit", id: "fig6-run", "class": "primary", text: "Show attention" });
    var form = h("form", { "class": "controls fig6-form" }, [input, button]);
    var out = h("div", { id: "fig6-output", "aria-live": "polite" });
    if (status.model_name) body.appendChild(h("p", { "class": "label model-name" }, ["model: ", h("code", { text: status.model_name })]));
    body.appendChild(form);
    body.appendChild(out);
    form.addEventListener("submit", function (e) {
      e.preventDefault();
      run();
    });
    function run() {
      button.disabled = true;
      button.textContent = "Running…";
      out.classList.add("busy");
      fetch("/api/attention?text=" + encodeURIComponent(input.value)).then(function (r) {
        return r.json().then(function (j) { return { ok: r.ok, json: j }; });
      }).then(function (res) {
        out.textContent = "";
        if (!res.ok) showError(out, res.json.error || "The server refused the request.");
        else renderModel(out, res.json, {});
      }).catch(function (err) {
        showError(out, "Request failed: " + err.message);
      }).then(function () {
        button.disabled = false;
        button.textContent = "Show attention";
        out.classList.remove("busy");
      });
    }
    if (input.value) run();
  }

  // The model's output under the input box: the translation, or the prompt and its continuation.
  function outputBox(data, groups, showInput) {
    var box = h("div", { "class": "fig6-outbox", "data-testid": "fig6-outbox" });
    var gpt = groups.order.length === 1 && groups.order[0] === "self";
    var hasOut = typeof data.output === "string";
    function line(label, node) { box.appendChild(h("div", { "class": "oline" }, [h("span", { "class": "olabel", text: label }), node])); }
    function outText() {
      return h("span", { "class": "otext" + (data.output ? "" : " empty"), "data-testid": "fig6-output-text", text: data.output || "(nothing: the model ended at once)" });
    }
    if (gpt && hasOut) {
      line("continuation", h("span", {}, [h("span", { "class": "prompt", text: data.text || "" }), outText()]));
    } else {
      if (showInput && data.text) line("input", h("span", { "class": "itext", text: data.text }));
      if (hasOut) line(groups.byKind.cross ? "translation" : "output", outText());
    }
    return box.childNodes.length ? box : null;
  }

  // data: {text?, output?, maps: [{name, kind?, layer?, query_tokens, key_tokens, weights: (H, T, L)}]}
  function renderModel(parent, data, opts) {
    if (!data || !Array.isArray(data.maps) || data.maps.length === 0) {
      showError(parent, "The model returned no attention maps.");
      return null;
    }
    var groups = groupMaps(data.maps);
    var mem = fig6Memory;
    var maxHeads = Math.max.apply(null, groups.order.map(function (k) { return groups.byKind[k].nHeads; }));
    var state = {
      kind: groups.byKind[mem.kind] ? mem.kind : groups.order[0],
      layer: mem.layer, head: mem.head === null ? 0 : mem.head,
      active: []
    };
    for (var k = 0; k < maxHeads; k++) state.active.push(mem.active && k < mem.active.length ? mem.active[k] : true);

    var outBox = outputBox(data, groups, opts.showInput);
    if (outBox) parent.appendChild(outBox);

    // Controls: kind, layer, heads.
    var kindBox = h("div", { "class": "seg", role: "group", "aria-label": "attention kind", id: "fig6-kinds" });
    var kindBtns = {};
    groups.order.forEach(function (kind) {
      var b = h("button", { type: "button", "data-kind": kind, text: groups.byKind[kind].label });
      b.addEventListener("click", function () { setKind(kind); });
      kindBtns[kind] = b;
      kindBox.appendChild(b);
    });
    var layerSel = h("select", { id: "fig6-layer", "aria-label": "layer" });
    layerSel.addEventListener("change", function () { state.layer = Number(layerSel.value); update(false); });
    var chips = h("div", { "class": "chips", id: "fig6-heads", role: "group", "aria-label": "heads shown in the head view" });
    parent.appendChild(h("div", { "class": "controls fig6-bar" }, [
      h("span", { "class": "ctl" }, [h("span", { "class": "ctl-label", text: "attention" }), kindBox]),
      h("label", { "class": "ctl" }, [h("span", { "class": "ctl-label", text: "layer" }), layerSel]),
      h("span", { "class": "ctl" }, [h("span", { "class": "ctl-label", text: "heads" }), chips])
    ]));
    var note = h("p", { "class": "kind-note" });
    parent.appendChild(note);

    // Head view and detail side by side, the model view below.
    var hvBox = h("div", { "class": "hv-scroll" });
    var hvInfo = h("p", { "class": "hv-info", "data-testid": "fig6-hv-info" });
    var headSel = h("select", { id: "fig6-head", "aria-label": "head shown in the detail view" });
    headSel.addEventListener("change", function () {
      state.head = headSel.value === "mean" ? "mean" : Number(headSel.value);
      update(false);
    });
    var detailTitle = h("span", { "class": "detail-title", "data-testid": "fig6-detail-title" });
    var holder = h("div", { "class": "hm-holder", "data-testid": "fig6-heatmap" });
    var info = h("div", { "class": "hm-info", "data-testid": "fig6-info" });
    parent.appendChild(h("div", { "class": "row fig6-views" }, [
      h("div", { "class": "panel", "data-testid": "fig6-hv-panel" }, [
        h("h3", { text: "Head view" }),
        h("p", { "class": "label", text: "Queries on the left, keys on the right; line opacity = attention weight, one colour per head. Hover a token to follow only its lines." }),
        hvBox, hvInfo
      ]),
      h("div", { "class": "panel" }, [
        h("h3", {}, ["Detail: ", detailTitle]),
        h("div", { "class": "controls tight" }, [h("label", {}, ["show ", headSel])]),
        holder, info
      ])
    ]));
    var mvBox = h("div", { "class": "mv-outer" });
    parent.appendChild(h("div", { "class": "panel fig6-mv" }, [
      h("h3", { text: "Model view" }),
      h("p", { "class": "label", text: "Every layer (rows) and head (columns) of this kind at a glance (shade ∝ √weight, so faint patterns show). Click a map to open it in the detail view." }),
      mvBox
    ]));

    var mv = null;

    function group() { return groups.byKind[state.kind]; }
    function currentMap() { return group().byLayer[state.layer]; }

    function setKind(kind) {
      state.kind = kind;
      update(true);
    }

    function fillControls() {
      var g = group();
      Object.keys(kindBtns).forEach(function (kd) { kindBtns[kd].setAttribute("aria-pressed", String(kd === state.kind)); });
      if (g.layers.indexOf(state.layer) < 0) state.layer = g.layers[0];
      layerSel.textContent = "";
      g.layers.forEach(function (L) { layerSel.appendChild(h("option", { value: String(L), text: "layer " + L })); });
      layerSel.value = String(state.layer);
      var nH = currentMap().weights.length;
      if (state.head !== "mean" && !(state.head < nH)) state.head = 0;
      headSel.textContent = "";
      for (var k = 0; k < nH; k++) headSel.appendChild(h("option", { value: String(k), text: "head " + k }));
      headSel.appendChild(h("option", { value: "mean", text: "mean of heads" }));
      headSel.value = String(state.head);
      note.textContent = KIND_NOTES[state.kind] || "";
      chips.textContent = "";
      for (k = 0; k < g.nHeads; k++) chips.appendChild(chip(k));
      var all = h("button", { type: "button", "class": "chip-all", text: "all" });
      all.addEventListener("click", function () {
        state.active = state.active.map(function () { return true; });
        update(false);
      });
      chips.appendChild(all);
    }

    function chip(k) {
      var sw = h("span", { "class": "sw" });
      sw.style.background = headColor(k);
      var b = h("button", {
        type: "button", "class": "chip" + (state.active[k] ? "" : " off"), "data-head": String(k),
        "aria-pressed": String(state.active[k]), title: "show or hide head " + k + " in the head view"
      }, [sw, "head " + k]);
      b.style.borderColor = state.active[k] ? headColor(k) : "";
      b.addEventListener("click", function () {
        state.active[k] = !state.active[k];
        update(false);
      });
      return b;
    }

    function update(kindChanged) {
      fillControls();
      var m = currentMap();
      headView(hvBox, m, state.active, hvInfo, state.kind);
      detailTitle.textContent = group().label + " · layer " + state.layer + " · " + (state.head === "mean" ? "mean of heads" : "head " + state.head);
      drawDetail(m);
      if (kindChanged || !mv) mv = modelView(mvBox, group(), pick);
      mv.select(state.layer, state.head);
      mem.kind = state.kind; mem.layer = state.layer; mem.head = state.head; mem.active = state.active.slice();
    }

    function drawDetail(m) {
      var w, color;
      if (state.head === "mean") {
        color = MEAN_COLOR;
        w = m.weights[0].map(function (row, t) {
          return row.map(function (_, l) {
            return m.weights.reduce(function (acc, hw) { return acc + hw[t][l]; }, 0) / m.weights.length;
          });
        });
      } else {
        color = headColor(state.head);
        w = m.weights[state.head];
      }
      holder.textContent = "";
      heatmap(holder, m.query_tokens, m.key_tokens, w, info, color);
    }

    function pick(layer, head) {
      state.layer = layer;
      state.head = head;
      update(false);
    }

    update(true);
    return {
      state: function () { return { kind: state.kind, layer: state.layer, head: state.head, active: state.active.slice() }; }
    };
  }

  // The head view of one map: lines from query t (left) to key l (right) with stroke-opacity equal
  // to weights[k][t][l], one colour per active head k.
  function headView(box, m, active, info, kind) {
    box.textContent = "";
    var qTok = m.query_tokens, kTok = m.key_tokens, T = qTok.length, L = kTok.length;
    var n = Math.max(T, L, 1);
    var rowH = n <= 24 ? 22 : n <= 48 ? 18 : 16;
    var fontSize = rowH >= 20 ? 13 : 11.5;
    var labelW = 118, gap = 180, top = 30;
    var W = 2 * labelW + gap, Ht = top + n * rowH + 8;
    var xq = labelW, xk = labelW + gap;
    // The shorter column is centred on the first ~30 rows of the longer: in view without scrolling.
    var span = Math.min(n, Math.max(30, Math.min(T, L)));
    var offQ = Math.max(0, span - T) * rowH / 2, offK = Math.max(0, span - L) * rowH / 2;
    function yq(t) { return top + offQ + (t + 0.5) * rowH; }
    function yk(l) { return top + offK + (l + 0.5) * rowH; }
    var svg = s("svg", {
      "class": "headview", viewBox: "0 0 " + W + " " + Ht, width: W, height: Ht, role: "img",
      "aria-label": "head view: lines from queries to keys", "data-testid": "fig6-headview"
    });
    var cross = kind === "cross";
    s("text", { "class": "hv-head", x: xq - 6, y: 16, "text-anchor": "end", text: cross ? "target · queries" : "queries" }, svg);
    s("text", { "class": "hv-head", x: xk + 6, y: 16, text: cross ? "keys · source" : "keys" }, svg);

    var heads = [];
    m.weights.forEach(function (_, k) { if (active[k]) heads.push(k); });
    function countAbove(th) {
      var c = 0;
      heads.forEach(function (k) { m.weights[k].forEach(function (row) { row.forEach(function (w) { if (w > th) c++; }); }); });
      return c;
    }
    // Masked (zero) weights draw nothing; for long texts the faintest lines are left out too.
    var th = 0, count = countAbove(0);
    for (var i = 0; count > HV_MAX_LINES && i < HV_THRESHOLDS.length; i++) { th = HV_THRESHOLDS[i]; count = countAbove(th); }
    svg.setAttribute("data-threshold", String(th));

    var byQ = qTok.map(function () { return []; }), byK = kTok.map(function () { return []; });
    var lines = s("g", { "class": "hv-lines" }, svg);
    // Each head's lines are shifted by a pixel or two, so heads that agree lie side by side
    // instead of the last one hiding the others.
    var H = m.weights.length, shift = Math.min(2.2, rowH * 0.55 / Math.max(H - 1, 1));
    heads.forEach(function (k) {
      var g = s("g", { stroke: headColor(k), "data-head": String(k) }, lines);
      var dy = (k - (H - 1) / 2) * shift;
      m.weights[k].forEach(function (row, t) {
        row.forEach(function (w, l) {
          if (!(w > th)) return;
          var ln = s("line", {
            "class": "att", x1: xq, y1: yq(t) + dy, x2: xk, y2: yk(l) + dy, "stroke-opacity": String(w),
            "data-q": String(t), "data-k": String(l), "data-head": String(k)
          }, g);
          byQ[t].push(ln);
          byK[l].push(ln);
        });
      });
    });

    var labels = { q: [], k: [] };
    function label(side, idx, text) {
      var left = side === "q";
      var y = left ? yq(idx) : yk(idx);
      var g = s("g", { "class": "hv-tok", tabindex: "0", "data-side": side, "data-index": String(idx), "data-testid": "fig6-hv-" + side }, svg);
      var bg = s("rect", { "class": "hv-bg", x: left ? 4 : xk + 4, y: y - rowH / 2 + 1, width: labelW - 8, height: rowH - 2, rx: 4 }, g);
      s("text", { x: left ? xq - 8 : xk + 8, y: y + fontSize * 0.36, "text-anchor": left ? "end" : "start", "font-size": fontSize, text: shorten(text, 15) }, g);
      s("title", { text: (left ? "query " : "key ") + idx + ": " + text }, g);
      g.addEventListener("mouseenter", function () { focus(side, idx); });
      g.addEventListener("focus", function () { focus(side, idx); });
      g.addEventListener("mouseleave", clear);
      g.addEventListener("blur", clear);
      labels[side].push({ g: g, bg: bg });
    }
    qTok.forEach(function (t, idx) { label("q", idx, t); });
    kTok.forEach(function (t, idx) { label("k", idx, t); });

    function defaultInfo() {
      info.textContent = heads.length === 0
        ? "All heads are off: turn one on above."
        : count + " lines" + (th > 0 ? " (weights under " + pct(100 * th, 1) + " are not drawn, to keep the page fast)" : "") + ". Hover or focus a token.";
    }

    function focus(side, idx) {
      clear();
      svg.classList.add("focus");
      (side === "q" ? byQ : byK)[idx].forEach(function (ln) { ln.classList.add("on"); });
      labels[side][idx].g.classList.add("on");
      // The other column's tokens are shaded by their strongest weight to/from the hovered token.
      var other = side === "q" ? "k" : "q";
      labels[other].forEach(function (lb, j) {
        var best = 0, bestK = -1;
        heads.forEach(function (k) {
          var w = side === "q" ? m.weights[k][idx][j] : m.weights[k][j][idx];
          if (w > best) { best = w; bestK = k; }
        });
        if (bestK >= 0) {
          lb.bg.style.fill = headColor(bestK);
          lb.bg.style.fillOpacity = String(0.08 + 0.5 * best);
        }
      });
      // Each active head's strongest link, in words.
      info.textContent = "";
      var tokens = side === "q" ? qTok : kTok, others = side === "q" ? kTok : qTok;
      info.appendChild(h("b", { text: (side === "q" ? "query " : "key ") + "“" + tokens[idx] + "”" }));
      info.appendChild(document.createTextNode(side === "q" ? " looks most at: " : " is looked at most by: "));
      heads.forEach(function (k, n2) {
        var best = -1, arg = 0;
        others.forEach(function (_, j) {
          var w = side === "q" ? m.weights[k][idx][j] : m.weights[k][j][idx];
          if (w > best) { best = w; arg = j; }
        });
        if (n2) info.appendChild(document.createTextNode(" · "));
        var span = h("span", { "class": "hv-best", text: "head " + k + " " + (side === "q" ? "→ " : "← ") + others[arg] + " " + pct(100 * best, 0) });
        span.style.color = headColor(k);
        info.appendChild(span);
      });
    }

    function clear() {
      svg.classList.remove("focus");
      Array.prototype.forEach.call(svg.querySelectorAll(".on"), function (node) { node.classList.remove("on"); });
      ["q", "k"].forEach(function (side) { labels[side].forEach(function (lb) { lb.bg.style.fill = ""; lb.bg.style.fillOpacity = ""; }); });
      defaultInfo();
    }

    defaultInfo();
    box.appendChild(svg);
  }

  // A small map drawn pixel by pixel (ImageData): cheap for any number of layers and heads.
  function thumbnail(w, color) {
    var T = w.length, L = T ? w[0].length : 0;
    if (!T || !L) return h("span", { "class": "mv-empty", text: "–" });
    var sx = Math.max(1, Math.floor(THUMB_PX / L)), sy = Math.max(1, Math.floor(THUMB_PX / T));
    var canvas = h("canvas", { width: String(L * sx), height: String(T * sy), "class": "mv-map" + (sx > 1 && sy > 1 ? " px" : "") });
    var ctx = canvas.getContext("2d");
    var img = ctx.createImageData(L * sx, T * sy), px = img.data, rgb = rgbOf(color), stride = L * sx * 4;
    for (var t = 0; t < T; t++) {
      for (var l = 0; l < L; l++) {
        var a = 0.04 + 0.96 * Math.sqrt(clamp01(w[t][l])); // sqrt: faint patterns stay visible at this size
        var r = 255 + (rgb[0] - 255) * a, g = 255 + (rgb[1] - 255) * a, b = 255 + (rgb[2] - 255) * a;
        for (var dy = 0; dy < sy; dy++) {
          var o = (t * sy + dy) * stride + l * sx * 4;
          for (var dx = 0; dx < sx; dx++, o += 4) { px[o] = r; px[o + 1] = g; px[o + 2] = b; px[o + 3] = 255; }
        }
      }
    }
    ctx.putImageData(img, 0, 0);
    return canvas;
  }

  // The model view: rows = layers, columns = heads of one kind; hovering shows which map a cell
  // is, clicking opens it in the detail view. Returns {select(layer, head)}.
  function modelView(box, g, onPick) {
    box.textContent = "";
    var scroll = h("div", { "class": "mv-scroll" });
    var grid = h("div", { "class": "mv-grid", "data-testid": "fig6-modelview", "data-kind": g.kind });
    grid.style.gridTemplateColumns = "auto repeat(" + g.nHeads + ", minmax(30px, 110px))";
    var tip = h("div", { "class": "mv-tip", role: "tooltip", id: "fig6-tooltip", "data-testid": "fig6-tooltip" });
    tip.hidden = true;
    grid.appendChild(h("span", { "class": "mv-corner" }));
    for (var k = 0; k < g.nHeads; k++) {
      var ch = h("span", { "class": "mv-colhead", text: "head " + k });
      ch.style.color = headColor(k);
      grid.appendChild(ch);
    }
    var cells = [], rowHeads = {};
    g.layers.forEach(function (L) {
      var rh = h("span", { "class": "mv-rowhead", text: "layer " + L });
      rowHeads[L] = rh;
      grid.appendChild(rh);
      var m = g.byLayer[L];
      for (var k2 = 0; k2 < g.nHeads; k2++) {
        if (k2 >= m.weights.length) { grid.appendChild(h("span")); continue; }
        var cell = h("button", {
          type: "button", "class": "mv-cell", "data-testid": "fig6-cell", "data-layer": String(L), "data-head": String(k2),
          "aria-label": g.label + ", layer " + L + ", head " + k2 + ": open in the detail view", "aria-describedby": "fig6-tooltip"
        }, [thumbnail(m.weights[k2], headColor(k2))]);
        wire(cell, L, k2, m);
        cells.push(cell);
        grid.appendChild(cell);
      }
    });

    function wire(cell, L, k3, m) {
      function show() {
        tip.textContent = "";
        var title = h("b", { text: "layer " + L + " · head " + k3 });
        title.style.color = headColor(k3);
        tip.appendChild(title);
        tip.appendChild(h("span", { text: g.label + " · " + m.query_tokens.length + " × " + m.key_tokens.length }));
        tip.appendChild(h("span", { "class": "dim", text: "click to open" }));
        tip.hidden = false;
        var ob = box.getBoundingClientRect(), cb = cell.getBoundingClientRect();
        tip.style.left = (cb.left - ob.left + cb.width / 2) + "px";
        tip.style.top = (cb.top - ob.top) + "px";
      }
      cell.addEventListener("mouseenter", show);
      cell.addEventListener("focus", show);
      cell.addEventListener("mouseleave", function () { tip.hidden = true; });
      cell.addEventListener("blur", function () { tip.hidden = true; });
      cell.addEventListener("click", function () { onPick(L, k3); });
    }

    scroll.appendChild(grid);
    box.appendChild(scroll);
    box.appendChild(tip);
    return {
      select: function (layer, head) {
        cells.forEach(function (c) {
          var on = Number(c.getAttribute("data-layer")) === layer && (head === "mean" || Number(c.getAttribute("data-head")) === head);
          c.classList.toggle("sel", on);
          c.setAttribute("aria-pressed", String(on));
        });
        Object.keys(rowHeads).forEach(function (L) { rowHeads[L].classList.toggle("sel", Number(L) === layer); });
      }
    };
  }

  // Long texts: one canvas instead of T x L SVG rectangles (250,000 elements would freeze the page).
  function heatmapCanvas(parent, qTok, kTok, w, info, color) {
    var T = qTok.length, L = kTok.length;
    var cell = Math.max(1, Math.min(8, Math.floor(900 / Math.max(T, L))));
    var canvas = h("canvas", { width: String(L * cell), height: String(T * cell), "class": "heatmap-canvas",
      "aria-label": "attention heatmap, " + T + " queries by " + L + " keys" });
    var ctx = canvas.getContext("2d");
    for (var r = 0; r < T; r++) {
      for (var l = 0; l < L; l++) {
        ctx.fillStyle = tint(color, 0.04 + 0.96 * clamp01(w[r][l]));
        ctx.fillRect(l * cell, r * cell, cell, cell);
      }
    }
    canvas.addEventListener("mousemove", function (e) {
      var box = canvas.getBoundingClientRect();
      var ll = Math.floor((e.clientX - box.left) / box.width * L), rr = Math.floor((e.clientY - box.top) / box.height * T);
      if (rr >= 0 && rr < T && ll >= 0 && ll < L) info.textContent = qTok[rr] + " → " + kTok[ll] + ": " + pct(100 * w[rr][ll]);
    });
    info.textContent = T + " queries (rows) × " + L + " keys (columns); hover the map.";
    parent.appendChild(canvas);
  }

  function heatmap(parent, qTok, kTok, w, info, color) {
    color = color || "#2f6fd0";
    var T = qTok.length, L = kTok.length;
    if (T * L > 6400) { heatmapCanvas(parent, qTok, kTok, w, info, color); return; }
    // Square cells that fit the panel's width; a tall map (many queries, few keys) scrolls.
    var cell = Math.max(6, Math.min(44, Math.floor(360 / Math.max(L, 1)), Math.floor(900 / Math.max(T, 1))));
    var labels = cell >= 12;
    var left = labels ? 90 : 10, top = labels ? 70 : 10;
    var W = left + L * cell + (labels ? 50 : 10), H = top + T * cell + 10; // room for the slanted key labels
    // Natural size (capped by CSS max-width): a short sentence stays small instead of filling the page.
    var svg = s("svg", { "class": "heatmap", viewBox: "0 0 " + W + " " + H, width: W, height: H, role: "img", "aria-label": "attention heatmap" });
    function label(t) { return t.length > 10 ? t.slice(0, 9) + "…" : t; }
    if (labels) {
      kTok.forEach(function (t, l) {
        var x = left + l * cell + cell / 2;
        s("text", { x: x, y: top - 6, transform: "rotate(-50 " + x + " " + (top - 6) + ")", text: label(t) }, svg);
      });
      qTok.forEach(function (t, r) { s("text", { x: left - 6, y: top + r * cell + cell * 0.68, "text-anchor": "end", text: label(t) }, svg); });
    }
    var g = s("g", {}, svg);
    for (var r = 0; r < T; r++) {
      for (var l = 0; l < L; l++) {
        var rect = s("rect", {
          x: left + l * cell, y: top + r * cell, width: cell - 1, height: cell - 1,
          fill: tint(color, 0.04 + 0.96 * clamp01(w[r][l])),
          "data-r": String(r), "data-l": String(l), "data-weight": String(w[r][l])
        }, g);
        rect.addEventListener("mouseenter", onHover);
        if (cell >= 30 && w[r][l] > 0) { // masked (exactly zero) cells stay blank
          s("text", {
            x: left + l * cell + (cell - 1) / 2, y: top + r * cell + cell * 0.62, "text-anchor": "middle",
            "class": "cellpct" + (w[r][l] > 0.5 ? " dark" : ""), text: (100 * w[r][l]).toFixed(0)
          }, g);
        }
      }
    }
    function onHover(e) {
      var rr = Number(e.target.getAttribute("data-r")), ll = Number(e.target.getAttribute("data-l"));
      info.textContent = qTok[rr] + " → " + kTok[ll] + ": " + pct(100 * w[rr][ll]);
    }
    info.textContent = "Rows are queries, columns keys; hover a cell.";
    parent.appendChild(svg);
  }

  // ------------------------------------------------------------------ start
  function safely(name, fn) {
    try {
      return fn();
    } catch (err) {
      console.error("explorer: " + name + " failed: " + (err && err.stack ? err.stack : err));
      return null;
    }
  }

  function start() {
    globalThis.QKVExplorer = {
      fig1: safely("figure 1", initFig1),
      fig2: safely("figure 2", initFig2),
      fig3: safely("figure 3", initFig3),
      fig4: safely("figure 4", initFig4),
      fig5: safely("figure 5", function () { initClocks(); initWordOrder(); return true; }),
      fig6: safely("figure 6", initFig6),
      ready: true
    };
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();
