/*
 * lang.js: the page's language. Chooses Chinese or English, fills every element that names a catalog
 * key (data-i18n: its HTML; data-i18n-aria, data-i18n-title, data-i18n-placeholder: that attribute),
 * and gives the figures T(key, {slot: value}) for the strings they draw. The strings themselves are
 * in catalog.js; this file holds none.
 *
 * The language, first that applies: <html data-lang>, fixed by a page made in one language (a
 * notebook's view, qkv.interpret.show); ?lang=zh|en in the address (`qkv explore --lang` prints one); the
 * reader's own choice from the toggle, remembered in localStorage; <html data-default-lang>, which
 * `qkv explore --export --lang` writes; the browser's languages (navigator.languages); Chinese.
 * Exposed as globalThis.QKVLang.
 */
(function () {
  "use strict";

  var CATALOG = globalThis.QKVCatalog;
  var LANGS = ["zh", "en"];
  var STORAGE_KEY = "qkv.explorer.lang";

  function known(code) {
    if (!code) return null;
    code = String(code).toLowerCase();
    for (var i = 0; i < LANGS.length; i++) {
      if (code === LANGS[i] || code.indexOf(LANGS[i] + "-") === 0) return LANGS[i];
    }
    return null;
  }

  function stored() {
    try { return known(globalThis.localStorage.getItem(STORAGE_KEY)); } catch (err) { return null; }
  }

  function choose() {
    // A page made in one language only (a notebook's view: its reader chose the language in the call).
    var fixed = known(document.documentElement.getAttribute("data-lang"));
    if (fixed) return fixed;
    var fromUrl = known(new URLSearchParams(location.search).get("lang"));
    if (fromUrl) return fromUrl;
    var mine = stored();
    if (mine) return mine;
    var given = known(document.documentElement.getAttribute("data-default-lang"));
    if (given) return given;
    var prefs = navigator.languages || [navigator.language];
    for (var i = 0; i < prefs.length; i++) {
      var k = known(prefs[i]);
      if (k) return k;
    }
    return "zh";
  }

  var lang = choose();
  var strings = CATALOG[lang];

  // T("fig2.seed", {seed: 3}) -> "随机种子 3". A missing key shows itself, so a test finds it.
  function T(key, slots) {
    var text = strings[key];
    if (text === undefined) {
      console.error("lang: no catalog entry " + key);
      return key;
    }
    if (!slots) return text;
    return text.replace(/\{(\w+)\}/g, function (all, name) {
      return slots[name] === undefined ? all : String(slots[name]);
    });
  }

  // The catalog's text with its inline markup dropped, for attributes and SVG text.
  function plain(key, slots) {
    var box = document.createElement("span");
    box.innerHTML = T(key, slots);
    return box.textContent;
  }

  function apply(root) {
    var scope = root || document;
    Array.prototype.forEach.call(scope.querySelectorAll("[data-i18n]"), function (el) {
      el.innerHTML = T(el.getAttribute("data-i18n"));
    });
    ["aria", "title", "placeholder"].forEach(function (attr) {
      var name = attr === "aria" ? "aria-label" : attr;
      Array.prototype.forEach.call(scope.querySelectorAll("[data-i18n-" + attr + "]"), function (el) {
        el.setAttribute(name, plain(el.getAttribute("data-i18n-" + attr)));
      });
    });
  }

  // The toggle remembers the choice and puts it in the address, then reloads: every figure is drawn
  // again in the other language (what the reader dragged is reset).
  function switchTo(other) {
    try { globalThis.localStorage.setItem(STORAGE_KEY, other); } catch (err) { /* file:// in some browsers */ }
    var url = new URL(location.href);
    url.searchParams.set("lang", other);
    location.replace(url.toString());
  }

  function wireToggle() {
    var button = document.getElementById("lang-toggle");
    if (!button) return;
    button.addEventListener("click", function () { switchTo(lang === "zh" ? "en" : "zh"); });
  }

  document.documentElement.setAttribute("lang", T("lang.code"));
  document.title = plain("page.title");

  globalThis.QKVLang = {
    lang: lang, T: T, plain: plain, apply: apply, wireToggle: wireToggle, LANGS: LANGS, STORAGE_KEY: STORAGE_KEY
  };
})();
