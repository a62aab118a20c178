/*
 * explorer.js: starts the explorer page. The page's scripts, each one concept: catalog.js (every
 * string, in Chinese and English), lang.js (the language and T()), constants.js (the figures'
 * numbers), table3.js and practice.js (data the figures draw), figures.js (their formulas), draw.js
 * (what every figure draws with), paper.js (the paper's attention figures), article.js (the figures
 * the articles describe), model_view.js (a model's attention maps), tokenizer.js, runtime.js and
 * decoding.js (the model in the page), answers.js (where the live figures' answers come from: that
 * model or the server) and this file.
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

  // Every CJK character the figures will draw: the page's text, the catalog's, the example's, and
  // the in-page model's vocabulary (what it reads and writes).
  function cjkText() {
    var live = document.getElementById("qkv-live");
    return document.body.textContent + JSON.stringify(globalThis.QKVPracticeExample || {}) +
      JSON.stringify(globalThis.QKVCatalog[L.lang]) + globalThis.QKVConstants.TOKENS.join("") +
      (live ? live.textContent : "");
  }

  // source: answers.js's (the model in the page, or the server's), or null.
  function start(source) {
    var status = source ? source.status : null;
    var live = source && source.attention ? source : null;
    globalThis.QKVExplorer = {
      fig1: safely("figure 1", P.initFig1),
      fig2: safely("figure 2", P.initFig2),
      fig3: safely("figure 3", P.initFig3),
      cost: safely("the table's cost", A.initCost),
      fig4: safely("figure 4", P.initFig4),
      multihead: safely("multi-head", A.initMultihead),
      fig5: safely("figure 5", function () { P.initClocks(); P.initWordOrder(); return true; }),
      stack: safely("encoder and decoder", function () {
        return A.initStack(status && status.sizes, "stack.sizes_run");
      }),
      teacher: safely("training and generating", function () { return A.initTeacher(live); }),
      practice: safely("practice problems", function () { return A.initPractice(live); }),
      fig6: safely("figure 6", function () { return globalThis.QKVModelView.initFig6(live); }),
      answers: source,
      lang: L.lang,
      ready: true
    };
    document.documentElement.setAttribute("data-ready", "1");
  }

  function boot() {
    L.apply();
    L.wireToggle();
    Promise.all([globalThis.QKVDraw.cjkFaceLoaded(cjkText()), globalThis.QKVAnswers.connect()]).then(function (r) {
      document.documentElement.classList.remove("qkv-loading");
      start(r[1]);
    });
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", boot);
  else boot();
})();
