/*
 * inline.js: starts the model figure alone, as a notebook cell shows it (qkv.interpret.show writes the
 * page, notebook.html, into an iframe: each view has a document of its own, so two views never share
 * an id, a style or a script). The maps are the page's embedded JSON (script#qkv-model-data).
 *
 * As on the explorer page, the page is not laid out until its CJK face has loaded (or a few seconds
 * have passed): Chromium shapes text once with the fonts it has, and text shaped before the face
 * arrived keeps its empty boxes. When the figure is drawn, <html data-ready="1">.
 */
(function () {
  "use strict";

  var L = globalThis.QKVLang;

  // Every CJK character the figure will draw: the maps' tokens and text, the catalog's.
  function cjkText() {
    var data = document.getElementById("qkv-model-data");
    return (data ? data.textContent : "") + JSON.stringify(globalThis.QKVCatalog[L.lang]);
  }

  function boot() {
    L.apply();
    globalThis.QKVDraw.cjkFaceLoaded(cjkText()).then(function () {
      document.documentElement.classList.remove("qkv-loading");
      try {
        globalThis.QKVModelView.initFig6(null, "fig6.notebook");
      } catch (err) {
        console.error("inline view failed: " + (err && err.stack ? err.stack : err));
      }
      document.documentElement.setAttribute("data-ready", "1");
    });
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", boot);
  else boot();
})();
