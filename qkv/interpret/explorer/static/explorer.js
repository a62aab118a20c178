/*
 * explorer.js: starts the explorer page. The page's scripts, each one concept: catalog.js (every
 * string, in Chinese and English), lang.js (the language and T()), constants.js (the figures'
 * numbers), table3.js and traces.js (data the figures draw), figures.js (their formulas), draw.js
 * (what every figure draws with), paper.js (the paper's attention figures), article.js (the figures
 * the articles describe), model_view.js (a model's attention maps) and this file.
 *
 * Order: the catalog's text goes in at once, while the page is not laid out (<html class="qkv-loading">
 * hides the body); the page is shown and the figures drawn only after its CJK face has loaded (or a
 * few seconds have passed), because Chromium shapes text once with the fonts it has then: text shaped
 * before the face arrived, SVG labels and badges alike, keeps its empty boxes. Each figure starts on
 * its own, so one that fails leaves the others working. When all are drawn, <html data-ready="1">.
 */
(function () {
  "use strict";

  var P = globalThis.QKVPaperFigures;
  var A = globalThis.QKVArticleFigures;
  var L = globalThis.QKVLang;

  function safely(name, fn) {
    try {
      return fn();
    } catch (err) {
      console.error("explorer: " + name + " failed: " + (err && err.stack ? err.stack : err));
      return null;
    }
  }

  // Every CJK character the figures will draw: the page's text, the catalog's, the traces'.
  function cjkText() {
    return document.body.textContent + JSON.stringify(globalThis.QKVTraces || {}) +
      JSON.stringify(globalThis.QKVCatalog[L.lang]) + globalThis.QKVConstants.TOKENS.join("");
  }

  // The server's status when there is one (a model loaded? which sizes? which trace?); else null.
  function serverStatus() {
    if (location.protocol !== "http:" && location.protocol !== "https:") return Promise.resolve(null);
    return fetch("/api/status").then(function (r) { return r.json(); }).catch(function () { return null; });
  }

  function start(status) {
    var traces = globalThis.QKVTraces || {};
    globalThis.QKVExplorer = {
      fig1: safely("figure 1", P.initFig1),
      fig2: safely("figure 2", P.initFig2),
      fig3: safely("figure 3", P.initFig3),
      cost: safely("the table's cost", A.initCost),
      fig4: safely("figure 4", P.initFig4),
      multihead: safely("multi-head", A.initMultihead),
      fig5: safely("figure 5", function () { P.initClocks(); P.initWordOrder(); return true; }),
      stack: safely("encoder and decoder", function () {
        return status && status.sizes ? A.initStack(status.sizes, "stack.sizes_run")
          : A.initStack(traces.teacher && traces.teacher.model, "stack.sizes_demo");
      }),
      teacher: safely("training and generating", function () { return A.initTeacher(status); }),
      practice: safely("practice problems", function () { return A.initPractice(status); }),
      fig6: safely("figure 6", function () { return globalThis.QKVModelView.initFig6(status); }),
      lang: L.lang,
      ready: true
    };
    document.documentElement.setAttribute("data-ready", "1");
  }

  function boot() {
    L.apply();
    L.wireToggle();
    Promise.all([globalThis.QKVDraw.cjkFaceLoaded(cjkText()), serverStatus()]).then(function (r) {
      document.documentElement.classList.remove("qkv-loading");
      start(r[1]);
    });
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", boot);
  else boot();
})();
