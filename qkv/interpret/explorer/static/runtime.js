/*
 * runtime.js: the reader's model in the page, on onnxruntime-web (vendored: qkv/interpret/explorer/vendor/).
 *
 * The graphs are those of `qkv export onnx` (qkv/interop/onnx.py): a translator's encoder and decoder
 * step, or a GPT's step; the KV cache goes in and comes back one position longer, so this file keeps
 * it between steps and reorders its rows for beam search. Every graph takes a weight per head (1 on,
 * 0 off) and hands back every head's attention, which the figures draw.
 *
 * Where the bytes come from: an exported page carries them inside itself, base64 in a script element
 * of type application/octet-stream that its data-qkv-file attribute names, so it works from file:// with no
 * network; a site (`qkv explore --site`) fetches NAME from beside index.html. The runtime's wasm is
 * stored gzipped (a quarter of its size) and unpacked by the browser's DecompressionStream.
 *
 * Two builds of onnxruntime-web are in the page (qkv/interpret/explorer/vendored.py): its WASM backend,
 * which every browser runs and the page starts on, with one thread unless the page is cross-origin
 * isolated (threads need SharedArrayBuffer, which only such a page has); and its WebGPU backend, which
 * the reader may switch to where the browser has WebGPU (an adapter) and JavaScript Promise
 * Integration (WebAssembly.Suspending, which that build waits on the GPU with). WebGPU is never
 * required, and not the default: a model this small decodes faster on the CPU, where each step is a
 * few hundred small kernels and no transfer (docs/BENCHMARKS.md).
 */
(function () {
  "use strict";

  function base64Bytes(text) {
    var bin = atob(text.replace(/\s+/g, "")), out = new Uint8Array(bin.length);
    for (var i = 0; i < bin.length; i++) out[i] = bin.charCodeAt(i);
    return out;
  }

  // gzip's magic number first: unpack; otherwise the bytes are already plain (a host that sent them
  // with Content-Encoding: gzip, which the browser undid).
  function gunzip(bytes) {
    if (bytes[0] !== 0x1f || bytes[1] !== 0x8b) return Promise.resolve(bytes);
    var stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream("gzip"));
    return new Response(stream).arrayBuffer().then(function (b) { return new Uint8Array(b); });
  }

  function fileBytes(name) {
    var el = document.querySelector('script[data-qkv-file="' + name + '"]');
    var bytes = el ? Promise.resolve(base64Bytes(el.textContent)) : fetch(name).then(function (r) {
      if (!r.ok) throw new Error(name + ": HTTP " + r.status);
      return r.arrayBuffer();
    }).then(function (b) { return new Uint8Array(b); });
    return bytes.then(gunzip);
  }

  function ones(layers, heads, off, kind) {
    var w = new Float32Array(layers * heads).fill(1);
    (off || []).forEach(function (o) { if (o[0] === kind && o[1] < layers && o[2] < heads) w[o[1] * heads + o[2]] = 0; });
    return w;
  }

  // Rows `rows` of the batch axis (axis 1) of a (L, B, ...) tensor: the cache of the hypotheses that go on.
  // A tensor of the runtime `tensor` came from (each build has its own Tensor class).
  function gatherRows(tensor, rows) {
    var dims = tensor.dims, per = 1;
    for (var d = 2; d < dims.length; d++) per *= dims[d];
    var src = tensor.data, b = dims[1], out = new Float32Array(dims[0] * rows.length * per);
    for (var l = 0; l < dims[0]; l++) {
      for (var i = 0; i < rows.length; i++) {
        var from = (l * b + rows[i]) * per;
        out.set(src.subarray(from, from + per), (l * rows.length + i) * per);
      }
    }
    var shape = dims.slice();
    shape[1] = rows.length;
    return new tensor.constructor("float32", out, shape);
  }

  function Model(manifest, sessions, ort, backend) {
    this.ort = ort;
    this.backend = backend;
    this.manifest = manifest;
    this.kind = manifest.kind;
    this.sizes = manifest.sizes;
    this.tokenizer = new globalThis.QKVTokenizer.Tokenizer(manifest.tokenizer);
    this.sessions = sessions;
  }

  // Its sessions' memory given back (the page switched backend).
  Model.prototype.release = function () {
    var sessions = this.sessions;
    Object.keys(sessions).forEach(function (name) { sessions[name].release(); });
  };

  // The cache of no position yet: (L, B, H, 0, d).
  Model.prototype.emptyCache = function (batch) {
    var s = this.sizes, T = this.ort.Tensor;
    return {
      keys: new T("float32", new Float32Array(0), [s.decoder_layers, batch, s.n_heads, 0, s.d_k]),
      values: new T("float32", new Float32Array(0), [s.decoder_layers, batch, s.n_heads, 0, s.d_v])
    };
  };

  // A translator's encoder on one source: the cross-attention's keys and values, and its self-attention.
  Model.prototype.encode = function (ids, off) {
    var s = this.sizes, T = this.ort.Tensor;
    var feeds = {
      source: new T("int64", BigInt64Array.from(ids.map(BigInt)), [1, ids.length]),
      heads: new T("float32", ones(s.encoder_layers, s.n_heads, off, "encoder_self"), [s.encoder_layers, s.n_heads])
    };
    return this.sessions.encoder.run(feeds).then(function (r) {
      return { keys: r.memory_keys, values: r.memory_values, weights: r.weights };
    });
  };

  // One step for `tokens` (one per row) at `position`; memory: the encoder's, one row per decoder row.
  Model.prototype.step = function (tokens, position, cache, memory, off) {
    var s = this.sizes, T = this.ort.Tensor, b = tokens.length;
    var feeds = {
      token: new T("int64", BigInt64Array.from(tokens.map(BigInt)), [b, 1]),
      position: new T("int64", new BigInt64Array(b).fill(BigInt(position)), [b, 1]),
      past_keys: cache.keys, past_values: cache.values
    };
    var session;
    if (this.kind === "translation") {
      feeds.memory_keys = memory.keys;
      feeds.memory_values = memory.values;
      feeds.self_heads = new T("float32", ones(s.decoder_layers, s.n_heads, off, "decoder_self"), [s.decoder_layers, s.n_heads]);
      feeds.cross_heads = new T("float32", ones(s.decoder_layers, s.n_heads, off, "cross"), [s.decoder_layers, s.n_heads]);
      session = this.sessions.decoder;
    } else {
      feeds.heads = new T("float32", ones(s.decoder_layers, s.n_heads, off, "self"), [s.decoder_layers, s.n_heads]);
      session = this.sessions.step;
    }
    return session.run(feeds).then(function (r) {
      return {
        logits: r.logits, cache: { keys: r.present_keys, values: r.present_values },
        self: r.self_weights || r.weights, cross: r.cross_weights || null
      };
    });
  };

  // Each backend's build, by the global its module script sets.
  var BUILDS = { wasm: "ort", webgpu: "ortWebGPU" };
  var PROVIDERS = { wasm: ["wasm"], webgpu: ["webgpu", "wasm"] };  // WebGPU's kernels, the CPU's for the rest

  // Promise of null where this browser can run `backend`, or of the catalog key that says why not.
  function unavailable(backend) {
    if (!globalThis[BUILDS[backend]]) return Promise.resolve("backend.no_runtime");
    if (backend === "wasm") return Promise.resolve(null);
    if (!globalThis.navigator || !navigator.gpu) return Promise.resolve("backend.no_webgpu");
    if (typeof WebAssembly.Suspending !== "function") return Promise.resolve("backend.no_jspi");
    return navigator.gpu.requestAdapter().then(function (adapter) {
      return adapter ? null : "backend.no_adapter";
    }, function () { return "backend.no_adapter"; });
  }

  function configure(ort, wasm) {
    ort.env.wasm.wasmBinary = wasm;
    ort.env.wasm.numThreads = globalThis.crossOriginIsolated ? Math.min(4, navigator.hardwareConcurrency || 1) : 1;
    ort.env.wasm.proxy = false;
    ort.env.logLevel = "error";
  }

  // config: the page's <script id="qkv-live"> JSON: {manifest, wasm: {backend: NAME}}; backend: "wasm"
  // (the default) or "webgpu". Each graph's bytes are read again for each backend's sessions: a page
  // keeps no copy of them beside the runtime's.
  function load(config, backend) {
    backend = backend || "wasm";
    return unavailable(backend).then(function (why) {
      if (why) throw new Error(why);
      var ort = globalThis[BUILDS[backend]];
      return fileBytes(config.wasm[backend]).then(function (wasm) {
        configure(ort, wasm);
        var graphs = config.manifest.graphs, names = Object.keys(graphs), sessions = {};
        var options = { executionProviders: PROVIDERS[backend], graphOptimizationLevel: "all", logSeverityLevel: 3 };  // errors only
        return names.reduce(function (chain, name) {
          return chain.then(function () { return fileBytes(graphs[name].file); }).then(function (bytes) {
            return ort.InferenceSession.create(bytes, options);
          }).then(function (session) { sessions[name] = session; });
        }, Promise.resolve()).then(function () { return new Model(config.manifest, sessions, ort, backend); });
      });
    });
  }

  globalThis.QKVRuntime = { load: load, unavailable: unavailable, gatherRows: gatherRows, backends: Object.keys(BUILDS) };
})();
