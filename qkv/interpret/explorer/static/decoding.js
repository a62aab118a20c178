/*
 * decoding.js: the decoding loops and the answers the figures draw, on the in-page model (runtime.js).
 *
 * The loops follow qkv's own, so that the page translates as `qkv translate` does:
 * greedy search and beam search as qkv/generation/beam.py (beam 4, GNMT's length penalty with
 * alpha 0.6, at most source + 50 tokens, <eos> the only token allowed at the limit, a sentence done
 * when its best finished hypothesis cannot be beaten by the best one still growing), and a GPT's
 * greedy continuation as qkv/generation/decode.py. The answers have the shapes of the server's
 * (qkv/interpret/model_maps.py for /api/attention, qkv/interpret/traces.py for /api/trace), so the
 * figures read one interface (answers.js) whichever computed them.
 */
(function () {
  "use strict";

  var BEAM = 4, ALPHA = 0.6, EXTRA = 50, TOP_K = 5, MAX_NEW = 32;
  var DECIMALS = 1e6;

  function round(x, scale) { return Math.round(x * (scale || DECIMALS)) / (scale || DECIMALS); }

  // log-softmax of row `r` of (B, V) logits, in float32 as PyTorch computes it.
  function logSoftmax(logits, r) {
    var v = logits.dims[1], row = logits.data.subarray(r * v, (r + 1) * v);
    var max = -Infinity, i;
    for (i = 0; i < v; i++) if (row[i] > max) max = row[i];
    var sum = 0;
    for (i = 0; i < v; i++) sum += Math.exp(row[i] - max);
    var out = new Float32Array(v), lse = max + Math.log(sum);
    for (i = 0; i < v; i++) out[i] = row[i] - lse;
    return out;
  }

  function argmax(row) {
    var best = 0;
    for (var i = 1; i < row.length; i++) if (row[i] > row[best]) best = i;
    return best;
  }

  function limitFor(model, sourceLength) {
    return Math.max(0, Math.min(sourceLength + EXTRA, model.sizes.max_len - 1));
  }

  // Row r of each layer's step weights (L, B, H, N) -> [layer][head] Float32Array(N).
  function stepRows(t, r) {
    var d = t.dims, per = d[3], out = [];
    for (var l = 0; l < d[0]; l++) {
      var heads = [];
      for (var h = 0; h < d[2]; h++) {
        var at = ((l * d[1] + r) * d[2] + h) * per;
        heads.push(t.data.slice(at, at + per));
      }
      out.push(heads);
    }
    return out;
  }

  // Feed `tokens` one by one from position 0 (the first is <bos>, or a GPT's first prompt token) and
  // keep every step's log-probabilities and attention; `choose(t, logp)`, if given, picks each next
  // token (the tokens then only start the sequence). Returns {tokens, logps, self, cross}.
  function run(model, memory, tokens, off, choose, maxSteps) {
    var seq = tokens.slice(), logps = [], self = [], cross = [];
    var cache = model.emptyCache(1);
    function next(t) {
      if (t >= seq.length || (choose && t >= maxSteps)) return Promise.resolve();
      return model.step([seq[t]], t, cache, memory, off).then(function (r) {
        cache = r.cache;
        var logp = logSoftmax(r.logits, 0);
        logps.push(logp);
        self.push(stepRows(r.self, 0));
        if (r.cross) cross.push(stepRows(r.cross, 0));
        if (choose && t === seq.length - 1) {
          var nxt = choose(t, logp, seq);
          if (nxt === null) return null;
          seq.push(nxt);
        }
        return next(t + 1);
      });
    }
    return next(0).then(function () { return { tokens: seq, logps: logps, self: self, cross: cross }; });
  }

  function encodeSource(model, text) {
    var tok = model.tokenizer;
    return tok.encode(text.trim()).concat([tok.eos]);
  }

  // Greedy search on one source (beam.py's greedy_search): the run of every step, <bos> and the ids in
  // r.tokens (<eos> not among them), each step's attention kept: they are the maps of the translation.
  function greedyRun(model, memory, srcLength, off) {
    var tok = model.tokenizer, limit = limitFor(model, srcLength);
    return run(model, memory, [tok.bos], off, function (t, logp) {
      var nxt = t >= limit ? tok.eos : argmax(logp);
      return nxt === tok.eos ? null : nxt;
    }, limit + 1);
  }

  // The m best (score + logp) over every row and token, best first: one pass, a sorted list of m kept.
  function best(logps, scores, m) {
    var kept = [];
    for (var j = 0; j < logps.length; j++) {
      var logp = logps[j];
      for (var v = 0; v < logp.length; v++) {
        var score = Math.fround(scores[j] + logp[v]);
        if (kept.length === m && !(score > kept[m - 1].score)) continue;
        var at = kept.length;
        while (at > 0 && kept[at - 1].score < score) at--;
        kept.splice(at, 0, { score: score, beam: j, token: v });
        if (kept.length > m) kept.pop();
      }
    }
    return kept;
  }

  function lengthPenalty(length) { return Math.pow((5 + length) / 6, ALPHA); }

  // Beam search on one source (beam.py's beam_search, n_best 1): the best finished hypothesis's ids.
  function beam(model, memory, srcLength, off, k) {
    k = k || BEAM;
    var tok = model.tokenizer, limit = limitFor(model, srcLength), gather = globalThis.QKVRuntime.gatherRows;
    var wide = { keys: gather(memory.keys, new Array(k).fill(0)), values: gather(memory.values, new Array(k).fill(0)) };
    var rows = [[tok.bos]], scores = [0], cache = model.emptyCache(1), finished = [];
    var bestFinished = -Infinity;
    function step(t) {
      var last = rows.map(function (r) { return r[r.length - 1]; });
      return model.step(last, t, cache, t === 0 ? memory : wide, off).then(function (r) {
        var atLimit = limit <= t, logps = [];
        for (var j = 0; j < rows.length; j++) {
          var logp = logSoftmax(r.logits, j);
          if (atLimit) logp = logp.map(function (x, v) { return v === tok.eos ? x : -Infinity; });
          logps.push(logp);
        }
        // The 2k best candidates: even if k of them end with <eos>, k others can continue.
        var cands = best(logps, scores, 2 * k);
        var penalty = lengthPenalty(t + 1);
        cands.slice(0, k).forEach(function (c) {
          if (c.token === tok.eos && isFinite(c.score)) {
            finished.push({ tokens: rows[c.beam].slice(1), score: c.score / penalty });
            bestFinished = Math.max(bestFinished, c.score / penalty);
          }
        });
        var alive = cands.filter(function (c) { return c.token !== tok.eos; }).slice(0, k);
        var done = atLimit || alive.length === 0 || (isFinite(bestFinished) && bestFinished >= alive[0].score / penalty);
        if (done) return;
        var parents = alive.map(function (c) { return c.beam; });
        cache = { keys: gather(r.cache.keys, parents), values: gather(r.cache.values, parents) };
        rows = alive.map(function (c) { return rows[c.beam].concat([c.token]); });
        scores = alive.map(function (c) { return c.score; });
        return step(t + 1);
      });
    }
    return step(0).then(function () {
      if (!finished.length) throw new Error("beam search: no hypothesis finished");
      finished.sort(function (a, b) { return b.score - a.score; });
      return finished[0].tokens;
    });
  }

  // [layer] of (H, T, L) nested lists from the steps' rows, each row padded with zeros to L keys.
  function stack(steps, layers, keys) {
    var out = [];
    for (var l = 0; l < layers; l++) {
      var heads = [];
      for (var h = 0; h < steps[0][l].length; h++) {
        heads.push(steps.map(function (s) {
          var row = Array.from(s[l][h], function (w) { return round(w, 1e7); });
          while (row.length < keys) row.push(0);
          return row;
        }));
      }
      out.push(heads);
    }
    return out;
  }

  // (L, 1, H, S, S) encoder weights -> [layer] of (H, S, S) nested lists.
  function encoderMaps(w) {
    var d = w.dims, out = [];
    for (var l = 0; l < d[0]; l++) {
      var heads = [];
      for (var h = 0; h < d[2]; h++) {
        var rows = [];
        for (var i = 0; i < d[3]; i++) {
          var at = ((l * d[1]) * d[2] + h) * d[3] * d[4] + i * d[4];
          rows.push(Array.from(w.data.subarray(at, at + d[4]), function (x) { return round(x, 1e7); }));
        }
        heads.push(rows);
      }
      out.push(heads);
    }
    return out;
  }

  function mapsOf(kind, weights, queries, keys) {
    return weights.map(function (w, layer) {
      return { name: kind.replace(/_/g, " ") + " \u00b7 layer " + layer, kind: kind, layer: layer,
               query_tokens: queries, key_tokens: keys, weights: w };
    });
  }

  function labels(tok, ids) { return ids.map(function (i) { return tok.label(i); }); }

  function outputText(tok, ids) { return tok.decode(ids).replace(/\n/g, " ").trim(); }

  // A translation and every attention map of the model producing it (model_maps.translation_maps): the
  // decoder reads <bos> y_1 ... y_n and produces y_1 ... y_n <eos>. Greedy search's own steps are those
  // maps; a beam's translation is read once more, token by token.
  function translationMaps(model, text, off, beamSize) {
    var tok = model.tokenizer, src = encodeSource(model, text);
    return model.encode(src, off).then(function (enc) {
      var steps = beamSize > 1 ? beam(model, enc, src.length, off, beamSize).then(function (ids) {
        return run(model, enc, [tok.bos].concat(ids), off);
      }) : greedyRun(model, enc, src.length, off);
      return steps.then(function (r) {
        var read = r.tokens, ids = read.slice(1), produced = ids.concat([tok.eos]);
        var srcTokens = labels(tok, src), readTokens = labels(tok, read), producedTokens = labels(tok, produced);
        var L = model.sizes.decoder_layers;
        return {
          text: text, output: outputText(tok, ids), model_name: "encoder-decoder",
          maps: mapsOf("encoder_self", encoderMaps(enc.weights), srcTokens, srcTokens)
            .concat(mapsOf("decoder_self", stack(r.self, L, read.length), producedTokens, readTokens))
            .concat(mapsOf("cross", stack(r.cross, L, src.length), producedTokens, srcTokens))
        };
      });
    });
  }

  // A GPT's greedy continuation and its self-attention over prompt and continuation
  // (model_maps.completion_maps): at most 32 new tokens, and a row stops after its <eos>.
  function completionMaps(model, text, off) {
    var tok = model.tokenizer, ids = tok.encode(text), hasEos = tok.eos !== null && tok.eos !== undefined;
    if (!ids.length) ids = [tok.bos !== null && tok.bos !== undefined ? tok.bos : 0];
    if (ids.length > model.sizes.max_len) return Promise.reject(new Error("practice.too_long"));
    var budget = Math.min(MAX_NEW, model.sizes.max_len - ids.length);
    return run(model, null, ids, off, function (t, logp, seq) {
      var made = seq.length - ids.length;
      if (made >= budget || (made > 0 && hasEos && seq[seq.length - 1] === tok.eos)) return null;
      return argmax(logp);
    }, model.sizes.max_len).then(function (r) {
      var seq = r.tokens, tokens = labels(tok, seq);
      return { text: text, output: tok.decode(seq.slice(ids.length)), model_name: "GPT",
               maps: mapsOf("self", stack(r.self, model.sizes.decoder_layers, seq.length), tokens, tokens) };
    });
  }

  function top(tok, logp, k) {
    var order = Array.from(logp.keys()).sort(function (a, b) { return logp[b] - logp[a] || a - b; }).slice(0, k);
    return order.map(function (i) { return [tok.label(i), round(Math.exp(logp[i]))]; });
  }

  function meanHead(heads) {
    var n = heads[0].length, out = new Float64Array(n);
    heads.forEach(function (row) { for (var i = 0; i < n; i++) out[i] += row[i] / heads.length; });
    return out;
  }

  // Training at once against generating one by one (traces.translation_trace): the greedy translation,
  // each step's candidates and cross-attention row, and the causal table of decoder layer 0.
  function translationTrace(model, text) {
    var tok = model.tokenizer, src = encodeSource(model, text);
    return model.encode(src, []).then(function (enc) {
      return greedyRun(model, enc, src.length, []).then(function (r) {
        var read = r.tokens, produced = read.slice(1).concat([tok.eos]), L = model.sizes.decoder_layers;
        var steps = r.logps.map(function (logp, t) {
          return { top: top(tok, logp, TOP_K), chosen: tok.label(produced[t]),
                   cross: Array.from(meanHead(r.cross[t][L - 1]), function (w) { return round(w); }) };
        });
        var selfW = r.self.map(function (s) {
          var row = Array.from(meanHead(s[0]));
          while (row.length < read.length) row.push(0);
          return row;
        });
        return {
          source: text, source_tokens: labels(tok, src), output: outputText(tok, read.slice(1)),
          read: labels(tok, read), target: labels(tok, produced),
          teacher: r.logps.map(function (logp, t) {
            return { top: top(tok, logp, TOP_K), p_answer: round(Math.exp(logp[produced[t]])) };
          }),
          self_log_weights: selfW.map(function (row, i) {
            return row.map(function (w, j) { return j <= i && w > 0 ? round(Math.log(w), 1e4) : null; });
          }),
          self_weights: selfW.map(function (row) { return row.map(function (w) { return round(w); }); }),
          steps: steps, model: modelSizes(model)
        };
      });
    });
  }

  // A sentence cut into next-token problems for a GPT (traces.practice_trace).
  function practiceTrace(model, text) {
    var tok = model.tokenizer, ids = tok.encode(text);
    if (ids.length < 2) return Promise.reject(new Error("practice.too_short"));
    if (ids.length > model.sizes.max_len) return Promise.reject(new Error("practice.too_long"));
    return run(model, null, ids, []).then(function (r) {
      var tokens = labels(tok, ids), problems = [];
      for (var t = 1; t < ids.length; t++) {
        var lp = r.logps[t - 1][ids[t]];
        problems.push({ prefix: tokens.slice(0, t), answer: tokens[t], p: round(Math.exp(lp)), nll: round(-lp),
                        top: top(tok, r.logps[t - 1], 3), unknown: tok.unk !== null && ids[t] === tok.unk });
      }
      var mean = problems.reduce(function (a, p) { return a + p.nll; }, 0) / problems.length;
      return { text: text, tokens: tokens, problems: problems, mean_nll: round(mean), model: modelSizes(model) };
    });
  }

  function modelSizes(model) { return sizesOf(model.sizes); }

  // A model's sizes as the encoder-decoder figure shows them (traces.model_sizes).
  function sizesOf(s) {
    return { arch: s.arch, d_model: s.d_model, n_heads: s.n_heads, d_k: s.d_k, d_ff: s.d_ff, n_layers: s.n_layers,
             n_decoder_layers: s.n_decoder_layers };
  }

  // Only the translation (the benchmarks time this: no maps).
  function translate(model, text, beamSize, off) {
    var src = encodeSource(model, text);
    return model.encode(src, off || []).then(function (enc) {
      var search = beamSize > 1 ? beam(model, enc, src.length, off || [], beamSize)
        : greedyRun(model, enc, src.length, off || []).then(function (r) { return r.tokens.slice(1); });
      return search.then(function (ids) { return outputText(model.tokenizer, ids); });
    });
  }

  globalThis.QKVDecoding = {
    translate: translate, translationMaps: translationMaps, completionMaps: completionMaps,
    translationTrace: translationTrace, practiceTrace: practiceTrace, encodeSource: encodeSource, sizesOf: sizesOf,
    BEAM: BEAM
  };
})();
