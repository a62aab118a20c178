/*
 * model_view.js: figure 6, a model's own attention maps: the head view, the model view and the heat
 * map of one head. The maps come from answers.js (the model in the page, or the server's
 * /api/attention), or from the JSON a notebook's view embeds (script#qkv-model-data). Every word is the catalog's
 * (globalThis.QKVLang.T). Exposed as globalThis.QKVModelView.
 */
(function () {
  "use strict";

  var D = globalThis.QKVDraw;
  var $ = D.$, h = D.h, s = D.s, pct = D.pct, tint = D.tint;
  var T = globalThis.QKVLang.T, plain = globalThis.QKVLang.plain;

  // ------------------------------------------------------------------ figure 6
  // A model's maps, grouped by kind and layer, in three linked views: the head view (lines from
  // queries to keys, one colour per head, opacity = weight, as in bertviz), the model view (a
  // small map per layer and head) and the detail heat map of one head.
  var KIND_ORDER = globalThis.QKVConstants.KINDS;
  // A kind's name and note from the catalog ("fig6.kind.cross", "fig6.note.cross"); an unknown kind
  // keeps the name its payload gave.
  function kindLabel(kind) { return KIND_ORDER.indexOf(kind) >= 0 ? T("fig6.kind." + kind) : kind.replace(/_/g, " "); }
  function kindNote(kind) { return KIND_ORDER.indexOf(kind) >= 0 ? T("fig6.note." + kind) : ""; }
  var HEAD_COLORS = ["#2f6fd0", "#e07b2e", "#2e9a6e", "#8a62c4", "#d24b5a", "#1b93a5",
    "#b0862a", "#c8559e", "#55708f", "#6f9a2a", "#9b5a3c", "#4955b8"];
  var MEAN_COLOR = "#4a5566";
  var HV_MAX_LINES = 12000; // SVG lines in the head view; more make hovering sluggish.
  var HV_THRESHOLDS = [0.001, 0.003, 0.01, 0.03, 0.1, 0.3];
  var THUMB_PX = 144; // model-view maps are drawn at up to 144 px and shown at ~80 CSS px (sharp on HiDPI)
  // Choices survive a new "Show attention": the user keeps looking at the same kind, layer, heads.
  // off: the heads switched off ("kind:layer:head"), kept for every later sentence until switched on.
  var fig6Memory = { kind: null, layer: null, head: null, active: null, off: [] };

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
        g = byKind[kind] = { kind: kind, label: kindLabel(kind), byLayer: {}, layers: [], nHeads: 0 };
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

  // source: answers.js's (the model in the page, or the server), or null; caption: the catalog key of
  // the line above embedded maps (a notebook's).
  function initFig6(source, caption) {
    var body = $("fig6-body");
    var embedded = $("qkv-model-data");
    if (embedded) {
      var data;
      try {
        data = JSON.parse(embedded.textContent);
      } catch (err) {
        showError(body, T("fig6.bad_json", { error: err.message }));
        return;
      }
      body.textContent = "";
      body.appendChild(h("p", { "class": "caption", text: T(caption || "fig6.notebook") }));
      return renderModel(body, data, { showInput: true, pronounHead: data.pronoun_head });
    }
    if (source && source.attention && source.status.model) return setupLive(body, source);
  }

  function showError(parent, message) {
    var old = parent.querySelector(".error");
    if (old) old.remove();
    parent.appendChild(h("p", { "class": "error", role: "alert", "data-testid": "fig6-error", text: message }));
  }

  // The notes of an answer (characters outside the vocabulary...), above the figure.
  function showNotes(parent, data) {
    (data.notes || []).forEach(function (n) {
      parent.appendChild(h("p", { "class": "note", role: "status", "data-testid": "fig6-note", text: n }));
    });
  }

  // Where the model in the page runs: WASM, or WebGPU where this browser has it (the option is off,
  // with the reason beside it, where it has not). Switching loads the model there and asks again
  // (rerun); a backend that fails hands the model back to WASM, and the line beside the switch says
  // why (status.fell_back). sync() shows where the model runs now, after each answer.
  function backendSwitch(body, source, rerun) {
    var status = source.status, unavailable = null;
    var sel = h("select", { id: "fig6-backend", "aria-label": plain("backend.aria") },
      globalThis.QKVRuntime.backends.map(function (b) { return h("option", { value: b, text: T("backend." + b) }); }));
    var note = h("span", { "class": "hint", id: "fig6-backend-note" });
    body.appendChild(h("p", { "class": "label backend" }, [T("backend.label"), sel, " ", note]));
    function sync() {
      sel.value = status.backend;
      note.textContent = status.fell_back || unavailable || plain("backend.why_default");
    }
    sync();
    source.backends().then(function (why) {
      Array.prototype.forEach.call(sel.options, function (o) {
        o.disabled = !!why[o.value] && o.value !== sel.value;
        if (why[o.value]) o.title = plain(why[o.value]);
      });
      if (why.webgpu) unavailable = plain("backend.unavailable", { why: plain(why.webgpu) });
      sync();
      sel.setAttribute("data-checked", "");
    });
    sel.addEventListener("change", function () {
      var asked = sel.value;
      sel.disabled = true;
      note.textContent = plain("backend.switching", { backend: plain("backend." + asked) });
      source.useBackend(asked).then(function () {
        sync();
        rerun();  // which enables the switch again when its answer is drawn
      }, function () {
        sync();
        sel.disabled = false;
      });
    });
    return { select: sel, sync: sync };
  }

  function setupLive(body, source) {
    var status = source.status;
    body.textContent = "";
    var input = h("input", {
      type: "text", id: "fig6-text", maxlength: String(status.max_text_chars || 500),
      placeholder: plain("fig6.placeholder_input"), "aria-label": plain("fig6.text_aria")
    });
    input.value = status.default_text || "";
    var button = h("button", { type: "submit", id: "fig6-run", "class": "primary", text: T("fig6.run") });
    var controls = [input];
    // A translator can search greedily or by beam, as `qkv translate --beam 1` and `--beam 4` do.
    var beamSel = null;
    if (status.beam) {
      beamSel = h("select", { id: "fig6-beam", "aria-label": plain("fig6.beam_aria") }, [
        h("option", { value: "1", text: T("fig6.greedy") }), h("option", { value: "4", text: T("fig6.beam4") })]);
      controls.push(beamSel);
    }
    controls.push(button);
    var form = h("form", { "class": "controls fig6-form" }, controls);
    var out = h("div", { id: "fig6-output", "aria-live": "polite" });
    if (status.model_name) body.appendChild(h("p", { "class": "label model-name" }, [T("fig6.model"), h("code", { text: status.model_name })]));
    if (status.live === "page") body.appendChild(h("p", { "class": "label", "data-testid": "fig6-live", text: T("fig6.live_page") }));
    var backendSel = source.useBackend ? backendSwitch(body, source, function () { return run(); }) : null;
    body.appendChild(form);
    body.appendChild(out);
    form.addEventListener("submit", function (e) {
      e.preventDefault();
      run();
    });
    // Switching a head off or on translates the sentence again without (or with) it.
    function toggleHead(name) {
      var off = fig6Memory.off, at = off.indexOf(name);
      if (at >= 0) off.splice(at, 1); else off.push(name);
      run();
    }
    function allOn() { fig6Memory.off = []; run(); }
    var asked = 0;
    function run() {
      var mine = ++asked;
      button.disabled = true;
      if (backendSel) backendSel.select.disabled = true;
      button.textContent = T("fig6.running");
      out.classList.add("busy");
      source.attention(input.value, fig6Memory.off.slice(), beamSel ? Number(beamSel.value) : 1).then(function (data) {
        if (mine !== asked) return;
        out.textContent = "";
        out.qkvAnswer = data;  // what is drawn, for a test to read beside the drawing
        showNotes(out, data);
        renderModel(out, data, { toggleHead: toggleHead, allOn: allOn, pronounHead: status.pronoun_head });
      }).catch(function (err) {
        if (mine !== asked) return;
        out.textContent = "";
        showError(out, err.qkvKey ? err.message : T("fig6.failed", { error: err.message }));
      }).then(function () {
        if (mine !== asked) return;
        button.disabled = false;
        if (backendSel) {
          backendSel.select.disabled = false;
          backendSel.sync();  // WASM again, where WebGPU failed
        }
        button.textContent = T("fig6.run");
        out.classList.remove("busy");
        out.setAttribute("data-done", String(mine));
        // When the first answer was on the page, in ms since the page was opened (bench/explorer_page.py).
        if (!out.hasAttribute("data-first-ms")) out.setAttribute("data-first-ms", String(Math.round(performance.now())));
      });
    }
    if (input.value) run();
    return { run: run };
  }

  // The model's output under the input box: the translation, or the prompt and its continuation.
  function outputBox(data, groups, showInput) {
    var box = h("div", { "class": "fig6-outbox", "data-testid": "fig6-outbox" });
    var gpt = groups.order.length === 1 && groups.order[0] === "self";
    var hasOut = typeof data.output === "string";
    function line(label, node) { box.appendChild(h("div", { "class": "oline" }, [h("span", { "class": "olabel", text: label }), node])); }
    function outText() {
      return h("span", { "class": "otext" + (data.output ? "" : " empty"), "data-testid": "fig6-output-text", text: data.output || T("fig6.nothing") });
    }
    if (gpt && hasOut) {
      line(T("fig6.continuation"), h("span", {}, [h("span", { "class": "prompt", text: data.text || "" }), outText()]));
    } else {
      if (showInput && data.text) line(T("fig6.input"), h("span", { "class": "itext", text: data.text }));
      if (hasOut) line(T(groups.byKind.cross ? "fig6.translation" : "fig6.output"), outText());
    }
    if (data.off && typeof data.output_all_heads === "string") {
      // With heads switched off, what the model wrote with every head on, to compare.
      line(T("fig6.output_all"), h("span", { "class": "otext", "data-testid": "fig6-output-all", text: data.output_all_heads }));
    }
    return box.childNodes.length ? box : null;
  }

  // data: {text?, output?, maps: [{name, kind?, layer?, query_tokens, key_tokens, weights: (H, T, L)}]}
  function renderModel(parent, data, opts) {
    if (!data || !Array.isArray(data.maps) || data.maps.length === 0) {
      showError(parent, T("fig6.no_maps"));
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
    // The first view of a model `qkv explain` measured: the head that resolves pronouns best.
    var pro = opts.pronounHead;
    if (pro && mem.kind === null && groups.byKind[pro.kind]) {
      state.kind = pro.kind; state.layer = pro.layer; state.head = pro.head;
    }

    var outBox = outputBox(data, groups, opts.showInput);
    if (outBox) parent.appendChild(outBox);

    // Controls: kind, layer, heads.
    var kindBox = h("div", { "class": "seg", role: "group", "aria-label": plain("fig6.kinds_aria"), id: "fig6-kinds" });
    var kindBtns = {};
    groups.order.forEach(function (kind) {
      var b = h("button", { type: "button", "data-kind": kind, text: groups.byKind[kind].label });
      b.addEventListener("click", function () { setKind(kind); });
      kindBtns[kind] = b;
      kindBox.appendChild(b);
    });
    var layerSel = h("select", { id: "fig6-layer", "aria-label": T("fig6.layer") });
    layerSel.addEventListener("change", function () { state.layer = Number(layerSel.value); update(false); });
    var chips = h("div", { "class": "chips", id: "fig6-heads", role: "group", "aria-label": plain("fig6.heads_aria") });
    parent.appendChild(h("div", { "class": "controls fig6-bar" }, [
      h("span", { "class": "ctl" }, [h("span", { "class": "ctl-label", text: T("fig6.attention") }), kindBox]),
      h("label", { "class": "ctl" }, [h("span", { "class": "ctl-label", text: T("fig6.layer") }), layerSel]),
      h("span", { "class": "ctl" }, [h("span", { "class": "ctl-label", text: T("fig6.heads") }), chips])
    ]));
    var note = h("p", { "class": "kind-note" });
    parent.appendChild(note);

    // Head view and detail side by side, the model view below.
    var hvBox = h("div", { "class": "hv-scroll" });
    var hvInfo = h("p", { "class": "hv-info", "data-testid": "fig6-hv-info" });
    var headSel = h("select", { id: "fig6-head", "aria-label": plain("fig6.head_aria") });
    headSel.addEventListener("change", function () {
      state.head = headSel.value === "mean" ? "mean" : Number(headSel.value);
      update(false);
    });
    var detailTitle = h("span", { "class": "detail-title", "data-testid": "fig6-detail-title" });
    var holder = h("div", { "class": "hm-holder", "data-testid": "fig6-heatmap" });
    // A live model: switch the head shown here off (its output zeroed before W^O) and translate again.
    var switchBox = h("span");
    var offBox = h("div", { "class": "off-box", "data-testid": "fig6-off" });
    var offNames = (data.off || []).map(function (x) { return x.join(":"); });
    var info = h("div", { "class": "hm-info", "data-testid": "fig6-info" });
    parent.appendChild(h("div", { "class": "row fig6-views" }, [
      h("div", { "class": "panel", "data-testid": "fig6-hv-panel" }, [
        h("h3", { text: T("fig6.head_view") }),
        h("p", { "class": "label", text: T("fig6.head_view_label") }),
        hvBox, hvInfo
      ]),
      h("div", { "class": "panel" }, [
        h("h3", {}, [T("fig6.detail"), detailTitle]),
        h("div", { "class": "controls tight" }, [h("label", {}, [T("fig6.show"), headSel]), switchBox]),
        holder, info, offBox
      ])
    ]));
    var mvBox = h("div", { "class": "mv-outer" });
    parent.appendChild(h("div", { "class": "panel fig6-mv" }, [
      h("h3", { text: T("fig6.model_view") }),
      h("p", { "class": "label", text: T("fig6.model_view_label") }),
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
      g.layers.forEach(function (L) { layerSel.appendChild(h("option", { value: String(L), text: T("fig6.layer_n", { n: L }) })); });
      layerSel.value = String(state.layer);
      var nH = currentMap().weights.length;
      if (state.head !== "mean" && !(state.head < nH)) state.head = 0;
      headSel.textContent = "";
      for (var k = 0; k < nH; k++) headSel.appendChild(h("option", { value: String(k), text: T("fig6.head_n", { n: k }) }));
      headSel.appendChild(h("option", { value: "mean", text: T("fig6.mean") }));
      headSel.value = String(state.head);
      note.innerHTML = kindNote(state.kind);
      chips.textContent = "";
      for (k = 0; k < g.nHeads; k++) chips.appendChild(chip(k));
      var all = h("button", { type: "button", "class": "chip-all", text: T("fig6.all") });
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
        "aria-pressed": String(state.active[k]), title: T("fig6.chip_title", { n: k })
      }, [sw, T("fig6.head_n", { n: k })]);
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
      detailTitle.textContent = group().label + " · " + T("fig6.layer_n", { n: state.layer }) + " · " +
        (state.head === "mean" ? T("fig6.mean") : T("fig6.head_n", { n: state.head }));
      drawDetail(m);
      drawSwitch();
      if (kindChanged || !mv) mv = modelView(mvBox, group(), pick, offNames);
      mv.select(state.layer, state.head);
      mem.kind = state.kind; mem.layer = state.layer; mem.head = state.head; mem.active = state.active.slice();
    }

    function drawSwitch() {
      switchBox.textContent = "";
      offBox.textContent = "";
      if (pro && state.kind === pro.kind && state.layer === pro.layer && state.head === pro.head) {
        offBox.appendChild(h("p", { "class": "figline", "data-testid": "fig6-pronoun-head", text: T("fig6.pronoun_head", {
          share: pct(100 * pro.share, 1), n: pro.n, two: pro.share_two === null ? "–" : pct(100 * pro.share_two, 1) }) }));
      }
      if (offNames.length) {
        var named = offNames.map(function (name) {
          var f = name.split(":");
          return kindLabel(f[0]) + " · " + T("fig6.layer_n", { n: f[1] }) + " · " + T("fig6.head_n", { n: f[2] });
        });
        offBox.appendChild(h("p", { "class": "label", text: T("fig6.off_list", { heads: named.join("; ") }) }));
        var note = h("p", { "class": "caption" });
        note.innerHTML = T("fig6.switch_note");
        offBox.appendChild(note);
      }
      if (!opts.toggleHead) return;
      if (offNames.length) {
        var on = h("button", { type: "button", "data-testid": "fig6-all-on", text: T("fig6.all_on") });
        on.addEventListener("click", opts.allOn);
        offBox.appendChild(on);
      }
      if (state.head === "mean") return;
      var name = state.kind + ":" + state.layer + ":" + state.head;
      var off = offNames.indexOf(name) >= 0;
      var b = h("button", { type: "button", "data-testid": "fig6-switch", "data-head": name,
        text: T(off ? "fig6.switch_on" : "fig6.switch_off") });
      b.addEventListener("click", function () { opts.toggleHead(name); });
      switchBox.appendChild(b);
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
    var qTok = m.query_tokens, kTok = m.key_tokens, nT = qTok.length, L = kTok.length;
    var n = Math.max(nT, L, 1);
    var rowH = n <= 24 ? 22 : n <= 48 ? 18 : 16;
    var fontSize = rowH >= 20 ? 13 : 11.5;
    var labelW = 118, gap = 180, top = 30;
    var W = 2 * labelW + gap, Ht = top + n * rowH + 8;
    var xq = labelW, xk = labelW + gap;
    // The shorter column is centred on the first ~30 rows of the longer: in view without scrolling.
    var span = Math.min(n, Math.max(30, Math.min(nT, L)));
    var offQ = Math.max(0, span - nT) * rowH / 2, offK = Math.max(0, span - L) * rowH / 2;
    function yq(t) { return top + offQ + (t + 0.5) * rowH; }
    function yk(l) { return top + offK + (l + 0.5) * rowH; }
    var svg = s("svg", {
      "class": "headview", viewBox: "0 0 " + W + " " + Ht, width: W, height: Ht, role: "img",
      "aria-label": plain("fig6.hv_aria"), "data-testid": "fig6-headview"
    });
    var cross = kind === "cross";
    s("text", { "class": "hv-head", x: xq - 6, y: 16, "text-anchor": "end", text: T(cross ? "fig6.hv_target_queries" : "fig6.hv_queries") }, svg);
    s("text", { "class": "hv-head", x: xk + 6, y: 16, text: T(cross ? "fig6.hv_keys_source" : "fig6.hv_keys") }, svg);

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
      s("title", { text: T(left ? "fig6.hv_query_title" : "fig6.hv_key_title", { i: idx, t: text }) }, g);
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
        ? T("fig6.hv_all_off")
        : T("fig6.hv_lines", { n: count }) + (th > 0 ? T("fig6.hv_threshold", { pct: pct(100 * th, 1) }) : "") + T("fig6.hv_hover");
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
      info.appendChild(h("b", { text: T(side === "q" ? "fig6.hv_query" : "fig6.hv_key") + " “" + tokens[idx] + "”" }));
      info.appendChild(document.createTextNode(T(side === "q" ? "fig6.hv_looks_at" : "fig6.hv_looked_at_by")));
      heads.forEach(function (k, n2) {
        var best = -1, arg = 0;
        others.forEach(function (_, j) {
          var w = side === "q" ? m.weights[k][idx][j] : m.weights[k][j][idx];
          if (w > best) { best = w; arg = j; }
        });
        if (n2) info.appendChild(document.createTextNode(" · "));
        var span = h("span", { "class": "hv-best", text: T("fig6.head_n", { n: k }) + " " + (side === "q" ? "→ " : "← ") + others[arg] + " " + pct(100 * best, 0) });
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
    var nT = w.length, L = nT ? w[0].length : 0;
    if (!nT || !L) return h("span", { "class": "mv-empty", text: "–" });
    var sx = Math.max(1, Math.floor(THUMB_PX / L)), sy = Math.max(1, Math.floor(THUMB_PX / nT));
    var canvas = h("canvas", { width: String(L * sx), height: String(nT * sy), "class": "mv-map" + (sx > 1 && sy > 1 ? " px" : "") });
    var ctx = canvas.getContext("2d");
    var img = ctx.createImageData(L * sx, nT * sy), px = img.data, rgb = rgbOf(color), stride = L * sx * 4;
    for (var t = 0; t < nT; t++) {
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
  function modelView(box, g, onPick, offNames) {
    box.textContent = "";
    var scroll = h("div", { "class": "mv-scroll" });
    var grid = h("div", { "class": "mv-grid", "data-testid": "fig6-modelview", "data-kind": g.kind });
    grid.style.gridTemplateColumns = "auto repeat(" + g.nHeads + ", minmax(30px, 110px))";
    var tip = h("div", { "class": "mv-tip", role: "tooltip", id: "fig6-tooltip", "data-testid": "fig6-tooltip" });
    tip.hidden = true;
    grid.appendChild(h("span", { "class": "mv-corner" }));
    for (var k = 0; k < g.nHeads; k++) {
      var ch = h("span", { "class": "mv-colhead", text: T("fig6.head_n", { n: k }) });
      ch.style.color = headColor(k);
      grid.appendChild(ch);
    }
    var cells = [], rowHeads = {};
    g.layers.forEach(function (L) {
      var rh = h("span", { "class": "mv-rowhead", text: T("fig6.layer_n", { n: L }) });
      rowHeads[L] = rh;
      grid.appendChild(rh);
      var m = g.byLayer[L];
      for (var k2 = 0; k2 < g.nHeads; k2++) {
        if (k2 >= m.weights.length) { grid.appendChild(h("span")); continue; }
        var isOff = (offNames || []).indexOf(g.kind + ":" + L + ":" + k2) >= 0;
        var cell = h("button", {
          type: "button", "class": "mv-cell" + (isOff ? " off" : ""), "data-testid": "fig6-cell", "data-layer": String(L), "data-head": String(k2),
          "aria-label": T("fig6.mv_cell_aria", { kind: g.label, l: L, k: k2 }), "aria-describedby": "fig6-tooltip"
        }, [thumbnail(m.weights[k2], headColor(k2))]);
        wire(cell, L, k2, m);
        cells.push(cell);
        grid.appendChild(cell);
      }
    });

    function wire(cell, L, k3, m) {
      function show() {
        tip.textContent = "";
        var title = h("b", { text: T("fig6.mv_layer_head", { l: L, k: k3 }) });
        title.style.color = headColor(k3);
        tip.appendChild(title);
        tip.appendChild(h("span", { text: g.label + " · " + m.query_tokens.length + " × " + m.key_tokens.length }));
        tip.appendChild(h("span", { "class": "dim", text: T("fig6.mv_click") }));
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

  // The heat map of one head (or of the mean): draw.js's grid of weights, the cell's percentage shown.
  function heatmap(parent, qTok, kTok, w, info, color) {
    var nT = qTok.length, L = kTok.length;
    D.weightGrid(parent, {
      rows: qTok, cols: kTok, color: color || "#2f6fd0", info: info, aria: nT * L > 6400
        ? plain("fig6.hm_canvas_aria", { t: nT, l: L }) : plain("fig6.hm_aria"),
      weight: function (r, l) { return w[r][l]; },
      // masked (exactly zero) cells stay blank
      text: function (r, l) { return w[r][l] > 0 ? (100 * w[r][l]).toFixed(0) : ""; },
      attrs: function (r, l) { return { "data-weight": String(w[r][l]) }; },
      describe: function (r, l) { return qTok[r] + " \u2192 " + kTok[l] + ": " + pct(100 * w[r][l]); },
      caption: T("fig6.hm_rows"), canvasCaption: T("fig6.hm_canvas", { t: nT, l: L }), width: 360, height: 900
    });
  }

  globalThis.QKVModelView = { initFig6: initFig6 };
})();
