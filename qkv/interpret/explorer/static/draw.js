/*
 * draw.js: what every figure of the explorer page draws with: DOM and SVG helpers, number formats,
 * the token colours, a 2-D plot with axes and the grid every table of weights is drawn as. Exposed as globalThis.QKVDraw; no figure of its own.
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

  // ------------------------------------------------------------------ the CJK face
  // A page is laid out only once its CJK face has loaded (or FONT_WAIT_MS have passed): Chromium shapes
  // text once with the fonts it has, and text shaped before the face arrived keeps its empty boxes.
  var FONT_WAIT_MS = 4000; // a face that never loads must not keep the figures from being drawn

  // The face loaded for every CJK character of `text` (each once), or the wait over.
  function cjkFaceLoaded(text) {
    if (!document.fonts || !document.fonts.load) return Promise.resolve();
    var seen = {}, chars = "";
    for (var i = 0; i < text.length; i++) {
      var ch = text[i];
      if (ch >= "\u2e80" && !seen[ch]) { seen[ch] = true; chars += ch; }
    }
    var wait = new Promise(function (resolve) { setTimeout(resolve, FONT_WAIT_MS); });
    var load = document.fonts.load('16px "qkv CJK"', chars || "小").catch(function () { return null; });
    return Promise.race([load, wait]);
  }

  // ------------------------------------------------------------------ a grid of weights
  // Every table of attention weights on the page is drawn here (figure 9's masked score table, figure
  // 11's heat map of one head): a cell per (row, column) tinted by its weight, the row and column labels,
  // an optional number in each cell, and the cell under the pointer named in `info`. Above
  // GRID_CANVAS_CELLS cells, one canvas instead (250,000 SVG elements would freeze the page).
  //
  // spec: {rows, cols: labels; weight(r, c): in [0, 1], or null for a masked cell (drawn grey);
  //        text(r, c): the cell's number ("" for none; shown when a cell is large enough); color;
  //        shade(w): how much of the colour a weight takes (default 0.04 + 0.96 w); info: an element
  //        (or null) and describe(r, c) its line; attrs(r, c): the cell's attributes (test ids, data-*);
  //        cell: the largest cell, px; width, height: the room, px; caption: info's line at rest; aria}
  var GRID_CANVAS_CELLS = 6400;
  var MASKED = "#f1f1f1";

  function weightGrid(parent, spec) {
    var nR = spec.rows.length, nC = spec.cols.length, color = spec.color || "#2f6fd0";
    var shade = spec.shade || function (w) { return 0.04 + 0.96 * Math.min(1, Math.max(0, w)); };
    function fill(r, c) {
      var w = spec.weight(r, c);
      return w === null ? MASKED : tint(color, shade(w));
    }
    function describe(r, c) { if (spec.info && spec.describe) spec.info.textContent = spec.describe(r, c); }
    if (nR * nC > GRID_CANVAS_CELLS) return gridCanvas(parent, spec, nR, nC, fill, describe);
    // Square cells that fit the room; a tall grid (many rows, few columns) scrolls.
    var cell = Math.max(6, Math.min(spec.cell || 44, Math.floor((spec.width || 360) / Math.max(nC, 1)),
      Math.floor((spec.height || 900) / Math.max(nR, 1))));
    var labels = cell >= 12;
    var left = labels ? 90 : 10, top = labels ? 70 : 10;
    var W = left + nC * cell + (labels ? 50 : 10), H = top + nR * cell + 10; // room for the slanted column labels
    // Natural size (capped by CSS max-width): a short sentence stays small instead of filling the page.
    var svg = s("svg", { "class": "heatmap", viewBox: "0 0 " + W + " " + H, width: W, height: H, role: "img", "aria-label": spec.aria });
    function label(t) { return t.length > 10 ? t.slice(0, 9) + "\u2026" : t; }
    if (labels) {
      spec.cols.forEach(function (t, c) {
        var x = left + c * cell + cell / 2;
        s("text", { x: x, y: top - 6, transform: "rotate(-50 " + x + " " + (top - 6) + ")", text: label(t) }, svg);
      });
      spec.rows.forEach(function (t, r) { s("text", { x: left - 6, y: top + r * cell + cell * 0.68, "text-anchor": "end", text: label(t) }, svg); });
    }
    var g = s("g", {}, svg);
    for (var r = 0; r < nR; r++) {
      for (var c = 0; c < nC; c++) {
        var box = s("g", Object.assign({ "class": "cell", "data-r": String(r), "data-l": String(c) }, spec.attrs ? spec.attrs(r, c) : {}), g);
        s("rect", { x: left + c * cell, y: top + r * cell, width: cell - 1, height: cell - 1, fill: fill(r, c) }, box);
        var text = spec.text ? spec.text(r, c) : "";
        if (text && cell >= 24) {
          var w = spec.weight(r, c);
          s("text", { x: left + c * cell + (cell - 1) / 2, y: top + r * cell + cell * 0.62, "text-anchor": "middle",
            "class": "cellpct" + (w === null ? " masked" : w > 0.5 ? " dark" : ""), text: text }, box);
        }
        box.addEventListener("mouseenter", describe.bind(null, r, c));
      }
    }
    if (spec.info) spec.info.textContent = spec.caption || "";
    parent.appendChild(svg);
    return svg;
  }

  function gridCanvas(parent, spec, nR, nC, fill, describe) {
    var cell = Math.max(1, Math.min(8, Math.floor(900 / Math.max(nR, nC))));
    var canvas = h("canvas", { width: String(nC * cell), height: String(nR * cell), "class": "heatmap-canvas", "aria-label": spec.aria });
    var ctx = canvas.getContext("2d");
    for (var r = 0; r < nR; r++) {
      for (var c = 0; c < nC; c++) {
        ctx.fillStyle = fill(r, c);
        ctx.fillRect(c * cell, r * cell, cell, cell);
      }
    }
    canvas.addEventListener("mousemove", function (e) {
      var box = canvas.getBoundingClientRect();
      var c = Math.floor((e.clientX - box.left) / box.width * nC), r = Math.floor((e.clientY - box.top) / box.height * nR);
      if (r >= 0 && r < nR && c >= 0 && c < nC) describe(r, c);
    });
    if (spec.info) spec.info.textContent = spec.canvasCaption || spec.caption || "";
    parent.appendChild(canvas);
    return canvas;
  }

  globalThis.QKVDraw = {
    $: $, h: h, s: s, setAttrs: setAttrs, tokChip: tokChip, fmt: fmt, pct: pct, vec: vec, tint: tint, makePlot: makePlot, point: point, COLORS: COLORS, SVGNS: SVGNS,
    cjkFaceLoaded: cjkFaceLoaded, weightGrid: weightGrid
  };
})();
