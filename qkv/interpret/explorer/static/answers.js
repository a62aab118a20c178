/*
 * answers.js: where the figures' answers come from, behind one interface, so that the page and the
 * server cannot drift: the model running in this page (runtime.js and decoding.js, an exported page
 * or a site) or the explorer's server (`qkv explore --run`, its /api/ routes). Either way:
 *
 *   QKVAnswers.connect()                      -> Promise of a source, or null (no model anywhere)
 *   source.status                             {model, default_text, max_text_chars, model_name, trace, sizes, ...}
 *   source.attention(text, off, beam)         -> Promise of model_maps' payload (figure 11)
 *   source.trace(text)                        -> Promise of traces' payload (figures 9 and 10)
 *   source.backends()                         -> Promise of {backend: null, or the catalog key of why not}
 *   source.useBackend(name)                   -> Promise, settled once the model runs there ("wasm", "webgpu"),
 *                                                or on WASM where it cannot (status.backend, status.fell_back)
 *
 * off: head names "kind:layer:head"; beam: 1 (greedy) or 4. A text the model cannot take is refused
 * here, before either source sees it, with a message in the reader's language (an Error whose
 * message is the catalog's text); a text with characters outside the vocabulary is answered, with a
 * note naming them (payload.notes).
 */
(function () {
  "use strict";

  var L = globalThis.QKVLang;
  var MAX_TEXT_CHARS = 500;  // qkv/interpret/explorer/payload.py's MAX_TEXT_CHARS

  function refuse(key, params) {
    var err = new Error(L.plain(key, params));
    err.qkvKey = key;
    return err;
  }

  // The text as the model reads it, or an Error to show: blank, too long, a NUL; a lone surrogate
  // (which no text the reader typed can hold, but a paste can) becomes U+FFFD, as the server does.
  function checked(text, maxChars) {
    if (typeof text !== "string" || !text.trim()) return { error: refuse("input.empty") };
    var n = Array.from(text).length;
    if (n > maxChars) return { error: refuse("input.too_long", { n: n, max: maxChars }) };
    if (text.indexOf("\u0000") >= 0) return { error: refuse("input.nul") };
    var fixed = text.replace(/[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(^|[^\uD800-\uDBFF])[\uDC00-\uDFFF]/g,
      function (m, before) { return (before || "") + "\uFFFD"; });
    return { text: fixed, surrogate: fixed !== text };
  }

  function heads(off) {
    return (off || []).map(function (name) {
      var p = name.split(":");
      return [p[0], Number(p[1]), Number(p[2])];
    });
  }

  // ------------------------------------------------------------------ the model in this page
  // The backend a link asks for (page.html?backend=webgpu), or WASM.
  function askedBackend() {
    var asked = new URLSearchParams(location.search).get("backend");
    return globalThis.QKVRuntime.backends.indexOf(asked) >= 0 ? asked : "wasm";
  }

  function pageSource(config) {
    var D = globalThis.QKVDecoding, R = globalThis.QKVRuntime, manifest = config.manifest;
    var model = null, started = null;

    // The model on `backend`; where that is not WASM and it fails, on WASM, with a note of why (WebGPU
    // is never required). The model it replaces is released once the new one runs.
    function start(backend) {
      var next = R.load(config, backend).catch(function (err) {
        if (backend === "wasm") throw err;
        fellBack(backend, err);
        return R.load(config, "wasm");
      });
      return next.then(function (m) {
        if (model && model !== m) model.release();
        model = m;
        status.backend = m.backend;
        return m;
      });
    }
    // What the reader is told, beside the switch (status.fell_back), until another backend is chosen.
    // onnxruntime's own message is a C++ status with file names in it: the reader gets its last
    // "message:" (what the browser said), the console all of it.
    function fellBack(backend, err) {
      var key = String((err && err.message) || err), why;
      if (/^backend\./.test(key)) why = L.plain(key);
      else {
        console.warn("qkv: " + backend + " failed, back on WASM: " + key);
        var last = key.lastIndexOf("message: ");
        why = (last >= 0 ? key.slice(last + 9) : key).replace(/[\s)]+$/, "");
        if (why.length > 160) why = why.slice(0, 159) + "…";
      }
      status.fell_back = L.plain("backend.fell_back", { backend: L.plain("backend." + backend), why: why });
    }

    var translation = manifest.kind === "translation";
    var status = {
      model: true, live: "page", backend: "wasm", default_text: config.default_text || "", max_text_chars: MAX_TEXT_CHARS,
      model_name: config.model_name || "", trace: translation ? "translation" : "practice",
      sizes: D.sizesOf(manifest.sizes), pronoun_head: config.pronoun_head || null, beam: translation
    };
    started = start(askedBackend());
    started.catch(function () {});

    // What the reader should know of a text the model reads: its characters outside the vocabulary,
    // and a lone surrogate replaced. Limits in tokens need the tokenizer, so they are checked here.
    function prepared(text, m) {
      var c = checked(text, MAX_TEXT_CHARS);
      if (c.error) throw c.error;
      var notes = [], unknown = m.tokenizer.unknown(c.text);
      if (unknown.length) notes.push(L.plain("input.unknown", { chars: unknown.slice(0, 12).join(" "), n: unknown.length }));
      if (c.surrogate) notes.push(L.plain("input.surrogate"));

      var ids;
      try {
        ids = translation ? D.encodeSource(m, c.text) : m.tokenizer.encode(c.text);
      } catch (err) {
        if (err.qkvUnknown) throw refuse("input.unknown_refused", { chars: err.qkvUnknown });
        throw err;
      }
      if (ids.length > m.sizes.max_len) throw refuse("input.too_many_tokens", { n: ids.length, max: m.sizes.max_len });
      return { text: c.text, notes: notes };
    }

    function localized(err) {
      if (err && /^practice\.too_(short|long)$/.test(err.message)) return refuse(err.message);
      return err;
    }

    // A question fails on WebGPU for a reason of its own (not the reader's text: the device lost,
    // a kernel it lacks): asked again on WASM, which every browser runs.
    function withModel(fn) {
      return started.then(function (m) {
        return Promise.resolve().then(function () { return fn(m); }).catch(function (err) {
          err = localized(err);
          if (m.backend === "wasm" || err.qkvKey) throw err;
          fellBack(m.backend, err);
          started = start("wasm");
          return started.then(fn);
        });
      }).catch(function (err) { throw localized(err); });
    }

    return {
      status: status,
      get ready() { return started; },
      model: function () { return model; },
      backends: function () {
        var out = {};
        return Promise.all(R.backends.map(function (b) {
          return R.unavailable(b).then(function (why) { out[b] = why; });
        })).then(function () { return out; });
      },
      useBackend: function (name) {
        status.fell_back = null;
        var next = started.catch(function () {}).then(function () { return start(name); });
        started = next;
        return next;
      },
      attention: function (text, off, beam) {
        return withModel(function (m) {
          var p = prepared(text, m), h = heads(off), size = translation ? (beam || 1) : 1;
          var maps = translation ? D.translationMaps(m, p.text, h, size) : D.completionMaps(m, p.text, h);
          return maps.then(function (payload) {
            if (p.notes.length) payload.notes = p.notes;
            if (!h.length) return payload;
            payload.off = h;
            var all = translation ? D.translate(m, p.text, size, []) : D.completionMaps(m, p.text, []).then(function (x) { return x.output; });
            return all.then(function (out) { payload.output_all_heads = out; return payload; });
          });
        });
      },
      trace: function (text) {
        return withModel(function (m) {
          var p = prepared(text, m);
          var tr = translation ? D.translationTrace(m, p.text) : D.practiceTrace(m, p.text);
          return tr.then(function (payload) { if (p.notes.length) payload.notes = p.notes; return payload; });
        });
      },
      translate: function (text, beam) {
        return withModel(function (m) { return D.translate(m, prepared(text, m).text, beam || 1, []); });
      }
    };
  }

  // ------------------------------------------------------------------ the explorer's server
  function serverSource(status) {
    function ask(path, query) {
      return fetch(path + "?" + query).then(function (r) {
        return r.json().then(function (j) {
          if (!r.ok) throw new Error(j && j.error ? L.plain("fig6.failed", { error: j.error }) : L.plain("fig6.refused"));
          return j;
        });
      });
    }
    function first(text) {
      var c = checked(text, status.max_text_chars || MAX_TEXT_CHARS);
      return c.error ? Promise.reject(c.error) : Promise.resolve(c.text);
    }
    return {
      status: status,
      ready: Promise.resolve(null),
      model: function () { return null; },
      attention: function (text, off, beam) {
        return first(text).then(function (t) {
          var q = "text=" + encodeURIComponent(t) + (off && off.length ? "&off=" + encodeURIComponent(off.join(",")) : "") +
            (beam > 1 ? "&beam=" + beam : "");
          return ask("/api/attention", q);
        });
      },
      trace: function (text) {
        return first(text).then(function (t) { return ask("/api/trace", "text=" + encodeURIComponent(t)); });
      }
    };
  }

  var connected = null;

  function connect() {
    if (connected) return connected;
    var live = document.getElementById("qkv-live");
    if (live) {
      var config = JSON.parse(live.textContent);
      connected = Promise.resolve(pageSource(config));
    } else if (location.protocol === "http:" || location.protocol === "https:") {
      connected = fetch("/api/status").then(function (r) { return r.ok ? r.json() : null; }).then(function (status) {
        return status && (status.model || status.trace) ? serverSource(status) : (status ? { status: status } : null);
      }).catch(function () { return null; });
    } else {
      connected = Promise.resolve(null);
    }
    return connected;
  }

  globalThis.QKVAnswers = { connect: connect, checked: checked, MAX_TEXT_CHARS: MAX_TEXT_CHARS };
})();
