/*
 * explorer.js: starts the explorer page. The page's scripts, each one concept: constants.js (the
 * figures' numbers), figures.js (their formulas), draw.js (what every figure draws with), paper.js
 * (figures 1-5), model_view.js (figure 6, a model's attention maps) and this file, which starts
 * each figure on its own, so that one that fails leaves the others working.
 */
(function () {
  "use strict";

  var P = globalThis.QKVPaperFigures;

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
      fig1: safely("figure 1", P.initFig1),
      fig2: safely("figure 2", P.initFig2),
      fig3: safely("figure 3", P.initFig3),
      fig4: safely("figure 4", P.initFig4),
      fig5: safely("figure 5", function () { P.initClocks(); P.initWordOrder(); return true; }),
      fig6: safely("figure 6", globalThis.QKVModelView.initFig6),
      ready: true
    };
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();
